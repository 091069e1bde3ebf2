"""RefineMask-style instance mask refinement, trained with an mmdetection-like config and runner.

A small ResNet-ish backbone + FPN feeds a semantic (foreground) branch and an instance branch
that RoI-aligns every ground-truth box and refines its mask in stages (7 -> 14 -> 28 -> 56),
each stage fusing the up-sampled instance features, RoI-aligned semantic features and the
previous stage's mask, with stage loss weights 0.25 / 0.65 / 0.75 / 1.0.  The heads have no
normalisation and use the mmcv/mmdet kaiming (fan_out) initialisation; SGD with momentum,
linear warm-up.

Bug: optimizer_config = dict(grad_clip=None).  The un-normalised multi-stage heads start with a
gradient norm of ~1.3e3 (loss 95); without clipping the momentum-SGD steps blow up during the
warm-up: the loss falls to 30 at iter 4, then goes 125, 89, 827, 3.9e3, 4.3e9 (grad norm 1.5e3,
6.3e3, 6.1e4, 1.8e10) and is nan from iter 10 on (the 'Iter [10/120]' log line is nan).
Report: https://github.com/zhanggang001/RefineMask/issues/14 (losses become nan on LVIS and COCO;
maintainer: "I found that using gradient clipping could avoid this problem ...
optimizer_config = dict(_delete_=True, grad_clip=dict(max_norm=35, norm_type=2))";
reporter: "It really works, thanks.").
Fix: optimizer_config = dict(grad_clip=dict(max_norm=35, norm_type=2)); the same run trains
(loss 95 -> ~0.8-1.3, no nan).
"""
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------- config
model = dict(
    type='RefineMaskLite',
    fpn_channels=32,
    roi_size=7,
    num_refine_stages=3,
    stage_loss_weights=[0.25, 0.65, 0.75, 1.0],
    semantic_loss_weight=1.0)
data = dict(samples_per_gpu=2, num_images=100, img_size=64, max_instances=6)
optimizer = dict(type='SGD', lr=0.02, momentum=0.9, weight_decay=0.0001)
optimizer_config = dict(grad_clip=None)
lr_config = dict(policy='step', warmup='linear', warmup_iters=25, warmup_ratio=0.001, step=[100])
runner = dict(type='IterBasedRunner', max_iters=120)
log_config = dict(interval=5)
seed = 1

IMG_MEAN = torch.tensor([123.675, 116.28, 103.53]).view(3, 1, 1) / 255.0
IMG_STD = torch.tensor([58.395, 57.12, 57.375]).view(3, 1, 1) / 255.0


# ----------------------------------------------------------------------------- data
class LVISLikeDataset:
    """Long-tail-ish scenes: a few small blobs of random colour per image, with boxes and masks."""

    def __init__(self, num_images, img_size, max_instances, seed=0):
        self.g = torch.Generator().manual_seed(seed)
        self.size = img_size
        self.max_instances = max_instances
        self.samples = [self._make() for _ in range(num_images)]

    def _make(self):
        g, S = self.g, self.size
        img = torch.rand(3, 1, 1, generator=g) * 0.6 + 0.2 + 0.05 * torch.randn(3, S, S, generator=g)
        yy, xx = torch.meshgrid(torch.arange(S).float(), torch.arange(S).float(), indexing='ij')
        boxes, masks = [], []
        for _ in range(int(torch.randint(2, self.max_instances, (1,), generator=g))):
            cy, cx = (torch.rand(2, generator=g) * (S - 12) + 6).tolist()
            ry, rx = (torch.rand(2, generator=g) * 9 + 2).tolist()
            m = (((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2) < 1
            if m.sum() < 6:
                continue
            img[:, m] = torch.rand(3, 1, generator=g) + 0.1 * torch.randn(3, int(m.sum()), generator=g)
            ys, xs = torch.nonzero(m, as_tuple=True)
            boxes.append(torch.tensor([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]).float())
            masks.append(m.float())
        img = (img - IMG_MEAN) / IMG_STD
        return dict(img=img, gt_bboxes=torch.stack(boxes), gt_masks=torch.stack(masks))

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i % len(self.samples)]


def roi_align(feat, boxes, out_size, spatial_scale):
    """RoIAlign of one feature map [C, H, W] for boxes [N, 4] (x1, y1, x2, y2, image coords)."""
    C, H, W = feat.shape
    x1, y1, x2, y2 = (boxes * spatial_scale).unbind(1)
    theta = torch.zeros(boxes.shape[0], 2, 3)
    theta[:, 0, 0] = (x2 - x1) / W
    theta[:, 0, 2] = (x1 + x2) / W - 1
    theta[:, 1, 1] = (y2 - y1) / H
    theta[:, 1, 2] = (y1 + y2) / H - 1
    grid = F.affine_grid(theta, (boxes.shape[0], C, out_size, out_size), align_corners=False)
    return F.grid_sample(feat.expand(boxes.shape[0], C, H, W), grid, align_corners=False)


# ----------------------------------------------------------------------------- model
def conv_bn_relu(cin, cout, stride=1):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


def conv_relu(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True))


class RefineMaskLite(nn.Module):
    def __init__(self, fpn_channels, roi_size, num_refine_stages, stage_loss_weights,
                 semantic_loss_weight):
        super().__init__()
        C = fpn_channels
        self.roi_size = roi_size
        self.stage_loss_weights = stage_loss_weights
        self.semantic_loss_weight = semantic_loss_weight
        # backbone (strides 4 / 8 / 16) + FPN
        self.stem = nn.Sequential(conv_bn_relu(3, 32, 2), conv_bn_relu(32, 32, 2))
        self.layer2 = nn.Sequential(conv_bn_relu(32, 64, 2), conv_bn_relu(64, 64))
        self.layer3 = nn.Sequential(conv_bn_relu(64, 128, 2), conv_bn_relu(128, 128))
        self.lateral_convs = nn.ModuleList([nn.Conv2d(c, C, 1) for c in (32, 64, 128)])
        self.fpn_conv = nn.Conv2d(C, C, 3, padding=1)
        # semantic branch
        self.semantic_convs = nn.Sequential(*[conv_relu(C, C) for _ in range(4)])
        self.semantic_logits = nn.Conv2d(C, 1, 1)
        # instance branch + refinement stages
        self.instance_convs = nn.Sequential(conv_relu(C, C), conv_relu(C, C))
        self.stage_convs = nn.ModuleList(
            [nn.Sequential(conv_relu(2 * C + 1, C), conv_relu(C, C)) for _ in range(num_refine_stages)])
        self.stage_logits = nn.ModuleList([nn.Conv2d(C, 1, 1) for _ in range(num_refine_stages + 1)])
        self.init_weights()

    def init_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):      # mmcv kaiming_init(mode='fan_out', nonlinearity='relu')
                nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
                if m.bias is not None:
                    nn.init.constant_(m.bias, 0)

    def extract_feat(self, img):
        c2 = self.stem(img)
        c3 = self.layer2(c2)
        c4 = self.layer3(c3)
        l2, l3, l4 = [lat(c) for lat, c in zip(self.lateral_convs, (c2, c3, c4))]
        l3 = l3 + F.interpolate(l4, scale_factor=2, mode='nearest')
        l2 = l2 + F.interpolate(l3, scale_factor=2, mode='nearest')
        return self.fpn_conv(l2)                                    # P2, stride 4

    def forward_train(self, img, gt_bboxes, gt_masks):
        p2 = self.extract_feat(img)
        sem_feat = self.semantic_convs(p2)
        sem_logits = self.semantic_logits(sem_feat)
        sem_target = torch.stack([F.avg_pool2d(m.amax(0)[None], 4)[0] for m in gt_masks])[:, None]
        losses = dict(loss_semantic=self.semantic_loss_weight * F.binary_cross_entropy_with_logits(
            sem_logits, (sem_target > 0.5).float()))
        stage_losses = [0.0] * len(self.stage_logits)
        for i, (boxes, masks) in enumerate(zip(gt_bboxes, gt_masks)):
            inst = self.instance_convs(roi_align(p2[i], boxes, self.roi_size, 0.25))
            logits = [self.stage_logits[0](inst)]
            size = self.roi_size
            for k, stage in enumerate(self.stage_convs):
                size *= 2
                inst = F.interpolate(inst, scale_factor=2, mode='bilinear', align_corners=False)
                sem_roi = roi_align(sem_feat[i], boxes, size, 0.25)
                prev = F.interpolate(logits[-1].sigmoid(), scale_factor=2, mode='bilinear',
                                     align_corners=False)
                inst = stage(torch.cat([inst, sem_roi, prev], dim=1))
                logits.append(self.stage_logits[k + 1](inst))
            for k, lg in enumerate(logits):
                s = lg.shape[-1]
                target = torch.stack([roi_align(m[None], b[None], s, 1.0)[0, 0]
                                      for m, b in zip(masks, boxes)])[:, None]
                stage_losses[k] = stage_losses[k] + self.stage_loss_weights[k] * \
                    F.binary_cross_entropy_with_logits(lg, (target > 0.5).float()) / len(gt_bboxes)
        for k, l in enumerate(stage_losses):
            losses['loss_stage%d' % k] = l
        return losses


# ----------------------------------------------------------------------------- runner
def build_optimizer(net, cfg):
    cfg = dict(cfg)
    assert cfg.pop('type') == 'SGD'
    return torch.optim.SGD(net.parameters(), **cfg)


def current_lr(it, base_lr, cfg):
    lr = base_lr * (0.1 ** sum(it >= s for s in cfg['step']))
    if cfg.get('warmup') == 'linear' and it < cfg['warmup_iters']:
        k = (1 - it / cfg['warmup_iters']) * (1 - cfg['warmup_ratio'])
        lr = lr * (1 - k)
    return lr


def parse_losses(losses):
    log_vars = {k: v.item() for k, v in losses.items()}
    loss = sum(v for v in losses.values())
    log_vars['loss'] = loss.item()
    return loss, log_vars


def train_detector(net, dataset, cfg_optimizer, cfg_optimizer_hook, cfg_lr, max_iters, interval):
    opt = build_optimizer(net, cfg_optimizer)
    base_lr = cfg_optimizer['lr']
    bs = data['samples_per_gpu']
    net.train()
    start = time.time()
    for it in range(max_iters):
        lr = current_lr(it, base_lr, cfg_lr)
        for group in opt.param_groups:
            group['lr'] = lr
        batch = [dataset[it * bs + k] for k in range(bs)]
        img = torch.stack([b['img'] for b in batch])
        losses = net.forward_train(img, [b['gt_bboxes'] for b in batch],
                                   [b['gt_masks'] for b in batch])
        loss, log_vars = parse_losses(losses)
        # OptimizerHook.after_train_iter
        opt.zero_grad()
        loss.backward()
        grad_norm = None
        if cfg_optimizer_hook['grad_clip'] is not None:
            grad_norm = nn.utils.clip_grad_norm_(net.parameters(), **cfg_optimizer_hook['grad_clip'])
        opt.step()
        if (it + 1) % interval == 0 or it == 0:
            msg = ', '.join('%s: %.4f' % (k, v) for k, v in log_vars.items())
            if grad_norm is not None:
                msg += ', grad_norm: %.4f' % grad_norm
            print('Iter [%d/%d]\tlr: %.3e, time: %.3f, %s' % (
                it + 1, max_iters, lr, (time.time() - start) / (it + 1), msg))


def main():
    torch.manual_seed(seed)
    dataset = LVISLikeDataset(data['num_images'], data['img_size'], data['max_instances'], seed=seed)
    cfg = dict(model)
    assert cfg.pop('type') == 'RefineMaskLite'
    net = RefineMaskLite(**cfg)
    train_detector(net, dataset, optimizer, optimizer_config, lr_config,
                   runner['max_iters'], log_config['interval'])


if __name__ == '__main__':
    main()
