"""Train a small RetinaNet (ResNet-style backbone + FPN + focal-loss head) on our
steel-sheet inspection images (scratches, dents and stains).

Layout follows an mmdetection v2 config: model / train_cfg / optimizer /
optimizer_config / lr_config dicts, anchor generator, max-IoU assigner,
delta box coder, sigmoid focal loss + L1 loss normalised by the positives.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

# ----------------------------------------------------------------------------- config
model_cfg = dict(
    backbone=dict(depth=(1, 1, 1), base_channels=16),
    neck=dict(out_channels=64, num_outs=4),
    bbox_head=dict(
        num_classes=3,
        in_channels=64,
        stacked_convs=4,
        feat_channels=64,
        anchor_generator=dict(octave_base_scale=4, scales_per_octave=3,
                              ratios=[0.5, 1.0, 2.0], strides=[8, 16, 32, 64]),
        bbox_coder=dict(target_means=[0.0, 0.0, 0.0, 0.0],
                        target_stds=[0.1, 0.1, 0.2, 0.2]),
        loss_cls=dict(gamma=2.0, alpha=0.25, loss_weight=1.0),
        loss_bbox=dict(loss_weight=1.0)),
)
train_cfg = dict(assigner=dict(pos_iou_thr=0.5, neg_iou_thr=0.4, min_pos_iou=0.0))
data_cfg = dict(samples_per_gpu=2, workers_per_gpu=0, num_images=160, img_size=96)
optimizer = dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0001)
optimizer_config = dict(grad_clip=None)
lr_config = dict(policy='step', warmup='linear', warmup_iters=50, warmup_ratio=0.001, step=[8])
total_epochs = 6
log_config = dict(interval=5)


# ----------------------------------------------------------------------------- data
class SteelDefectDataset(Dataset):
    """Grey steel-sheet crops with one or two annotated defects."""

    CLASSES = ('stain', 'scratch', 'dent')
    MEAN = torch.tensor([123.675, 116.28, 103.53]).view(3, 1, 1)
    STD = torch.tensor([58.395, 57.12, 57.375]).view(3, 1, 1)
    COLOURS = torch.tensor([[200., 60., 50.], [50., 170., 70.], [220., 210., 60.]])

    def __init__(self, num_images, img_size, seed=0, min_defects=1, max_defects=2, min_size=8, max_size=30):
        self.num_images = num_images
        self.img_size = img_size
        self.seed = seed
        self.min_defects, self.max_defects = min_defects, max_defects
        self.min_size, self.max_size = min_size, max_size

    def __len__(self):
        return self.num_images

    def _draw(self, g):
        s = self.img_size
        img = torch.empty(3, s, s).uniform_(60, 110, generator=g)
        n = int(torch.randint(self.min_defects, self.max_defects + 1, (1,), generator=g))
        boxes, labels = [], []
        for _ in range(n):
            cls = int(torch.randint(0, len(self.CLASSES), (1,), generator=g))
            w = int(torch.randint(self.min_size, self.max_size, (1,), generator=g))
            h = int(torch.randint(self.min_size, self.max_size, (1,), generator=g))
            if cls == 1:
                w = max(4, w // 2)
            x = int(torch.randint(0, s - w, (1,), generator=g))
            y = int(torch.randint(0, s - h, (1,), generator=g))
            colour = self.COLOURS[cls] + torch.empty(3).uniform_(-30, 30, generator=g)
            img[:, y:y + h, x:x + w] = colour.view(3, 1, 1) + torch.randn(3, h, w, generator=g) * 8
            boxes.append([x, y, x + w, y + h])
            labels.append(cls)
        img = img.clamp(0, 255)
        return img, torch.tensor(boxes, dtype=torch.float32), torch.tensor(labels)

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(self.seed * 100003 + idx)
        img, boxes, labels = self._draw(g)
        if torch.rand(1, generator=g).item() < 0.5:
            img = img.flip(-1)
            boxes = torch.stack([self.img_size - boxes[:, 2], boxes[:, 1],
                                 self.img_size - boxes[:, 0], boxes[:, 3]], dim=1)
        img = (img - self.MEAN) / self.STD
        return dict(img=img, gt_bboxes=boxes, gt_labels=labels)


def collate(batch):
    return dict(img=torch.stack([b['img'] for b in batch]),
                gt_bboxes=[b['gt_bboxes'] for b in batch],
                gt_labels=[b['gt_labels'] for b in batch])


# ----------------------------------------------------------------------------- model
class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + idt)


class TinyResNet(nn.Module):
    def __init__(self, depth, base_channels):
        super().__init__()
        c = base_channels
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                                  nn.Conv2d(c, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True))
        self.stages = nn.ModuleList()
        self.out_channels = []
        cin = c
        for i, n in enumerate(depth):
            cout = c * 2 ** (i + 1)
            blocks = [BasicBlock(cin, cout, 2)] + [BasicBlock(cout, cout, 1) for _ in range(n - 1)]
            self.stages.append(nn.Sequential(*blocks))
            self.out_channels.append(cout)
            cin = cout

    def forward(self, x):
        x = self.stem(x)
        outs = []
        for stage in self.stages:
            x = stage(x)
            outs.append(x)
        return outs


class FPN(nn.Module):
    def __init__(self, in_channels, out_channels, num_outs):
        super().__init__()
        self.lateral_convs = nn.ModuleList([nn.Conv2d(c, out_channels, 1) for c in in_channels])
        self.fpn_convs = nn.ModuleList([nn.Conv2d(out_channels, out_channels, 3, padding=1) for _ in in_channels])
        self.extra_convs = nn.ModuleList()
        cin = in_channels[-1]
        for _ in range(num_outs - len(in_channels)):
            self.extra_convs.append(nn.Conv2d(cin, out_channels, 3, stride=2, padding=1))
            cin = out_channels
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, feats):
        laterals = [conv(f) for conv, f in zip(self.lateral_convs, feats)]
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + F.interpolate(laterals[i], size=laterals[i - 1].shape[-2:], mode='nearest')
        outs = [conv(l) for conv, l in zip(self.fpn_convs, laterals)]
        x = feats[-1]
        for i, conv in enumerate(self.extra_convs):
            x = conv(x if i == 0 else F.relu(x))
            outs.append(x)
        return outs


class RetinaHead(nn.Module):
    def __init__(self, num_classes, in_channels, stacked_convs, feat_channels, num_anchors):
        super().__init__()
        self.num_classes = num_classes
        self.cls_convs = nn.ModuleList()
        self.reg_convs = nn.ModuleList()
        for i in range(stacked_convs):
            cin = in_channels if i == 0 else feat_channels
            self.cls_convs.append(nn.Conv2d(cin, feat_channels, 3, padding=1))
            self.reg_convs.append(nn.Conv2d(cin, feat_channels, 3, padding=1))
        self.retina_cls = nn.Conv2d(feat_channels, num_anchors * num_classes, 3, padding=1)
        self.retina_reg = nn.Conv2d(feat_channels, num_anchors * 4, 3, padding=1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, std=0.01)
                nn.init.zeros_(m.bias)
        nn.init.constant_(self.retina_cls.bias, -math.log((1 - 0.01) / 0.01))

    def forward_single(self, x):
        c, r = x, x
        for conv in self.cls_convs:
            c = F.relu(conv(c))
        for conv in self.reg_convs:
            r = F.relu(conv(r))
        n = x.shape[0]
        cls = self.retina_cls(c).permute(0, 2, 3, 1).reshape(n, -1, self.num_classes)
        reg = self.retina_reg(r).permute(0, 2, 3, 1).reshape(n, -1, 4)
        return cls, reg

    def forward(self, feats):
        outs = [self.forward_single(f) for f in feats]
        return [o[0] for o in outs], [o[1] for o in outs]


# ----------------------------------------------------------------------------- anchors / targets
def grid_anchors(featmap_sizes, cfg):
    scales = torch.tensor([2 ** (i / cfg['scales_per_octave']) for i in range(cfg['scales_per_octave'])])
    ratios = torch.tensor(cfg['ratios'])
    all_anchors = []
    for (h, w), stride in zip(featmap_sizes, cfg['strides']):
        base = stride * cfg['octave_base_scale'] * scales
        h_ratios = ratios.sqrt()
        ws = (base[None, :] / h_ratios[:, None]).reshape(-1)
        hs = (base[None, :] * h_ratios[:, None]).reshape(-1)
        base_anchors = torch.stack([-0.5 * ws, -0.5 * hs, 0.5 * ws, 0.5 * hs], dim=1)
        sy, sx = torch.meshgrid(torch.arange(h) * stride, torch.arange(w) * stride, indexing='ij')
        shifts = torch.stack([sx, sy, sx, sy], dim=-1).reshape(-1, 1, 4).float()
        all_anchors.append((shifts + base_anchors[None]).reshape(-1, 4))
    return torch.cat(all_anchors)


def box_iou(a, b):
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).prod(-1)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


def assign(anchors, gt_bboxes, cfg):
    """Max-IoU assigner: -1 ignore, 0 negative, k+1 positive for gt k."""
    assigned = anchors.new_full((anchors.shape[0],), -1, dtype=torch.long)
    if gt_bboxes.numel() == 0:
        assigned[:] = 0
        return assigned
    ious = box_iou(anchors, gt_bboxes)
    max_iou, argmax = ious.max(dim=1)
    assigned[max_iou < cfg['neg_iou_thr']] = 0
    pos = max_iou >= cfg['pos_iou_thr']
    assigned[pos] = argmax[pos] + 1
    gt_max, gt_argmax = ious.max(dim=0)
    for k in range(gt_bboxes.shape[0]):
        if gt_max[k] > cfg['min_pos_iou']:
            assigned[ious[:, k] == gt_max[k]] = k + 1
    return assigned


def encode(anchors, gt, means, stds):
    pw = anchors[:, 2] - anchors[:, 0]
    ph = anchors[:, 3] - anchors[:, 1]
    px = anchors[:, 0] + 0.5 * pw
    py = anchors[:, 1] + 0.5 * ph
    gw = gt[:, 2] - gt[:, 0]
    gh = gt[:, 3] - gt[:, 1]
    gx = gt[:, 0] + 0.5 * gw
    gy = gt[:, 1] + 0.5 * gh
    deltas = torch.stack([(gx - px) / pw, (gy - py) / ph, torch.log(gw / pw), torch.log(gh / ph)], dim=1)
    return (deltas - deltas.new_tensor(means)) / deltas.new_tensor(stds)


def sigmoid_focal_loss(logits, targets, gamma, alpha):
    p = logits.sigmoid()
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction='none')
    p_t = p * targets + (1 - p) * (1 - targets)
    a_t = alpha * targets + (1 - alpha) * (1 - targets)
    return a_t * (1 - p_t) ** gamma * ce


class RetinaNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.backbone = TinyResNet(**cfg['backbone'])
        self.neck = FPN(self.backbone.out_channels, **cfg['neck'])
        hcfg = cfg['bbox_head']
        self.hcfg = hcfg
        num_anchors = len(hcfg['anchor_generator']['ratios']) * hcfg['anchor_generator']['scales_per_octave']
        self.bbox_head = RetinaHead(hcfg['num_classes'], hcfg['in_channels'], hcfg['stacked_convs'],
                                    hcfg['feat_channels'], num_anchors)

    def forward_train(self, img, gt_bboxes, gt_labels, train_cfg):
        feats = self.neck(self.backbone(img))
        cls_scores, bbox_preds = self.bbox_head(feats)
        anchors = grid_anchors([f.shape[-2:] for f in feats], self.hcfg['anchor_generator'])
        cls_scores = torch.cat(cls_scores, dim=1)
        bbox_preds = torch.cat(bbox_preds, dim=1)
        num_classes = self.hcfg['num_classes']
        cls_targets, reg_targets, valid, pos_mask = [], [], [], []
        for boxes, labels in zip(gt_bboxes, gt_labels):
            assigned = assign(anchors, boxes, train_cfg['assigner'])
            t = torch.zeros(anchors.shape[0], num_classes)
            pos = assigned > 0
            t[pos, labels[assigned[pos] - 1]] = 1.0
            r = torch.zeros(anchors.shape[0], 4)
            if pos.any():
                coder = self.hcfg['bbox_coder']
                r[pos] = encode(anchors[pos], boxes[assigned[pos] - 1], coder['target_means'], coder['target_stds'])
            cls_targets.append(t); reg_targets.append(r); valid.append(assigned >= 0); pos_mask.append(pos)
        cls_targets = torch.stack(cls_targets)
        reg_targets = torch.stack(reg_targets)
        valid = torch.stack(valid)
        pos_mask = torch.stack(pos_mask)
        num_pos = max(pos_mask.sum().item(), 1)
        lc = self.hcfg['loss_cls']
        loss_cls = sigmoid_focal_loss(cls_scores[valid], cls_targets[valid], lc['gamma'], lc['alpha']).sum() / num_pos
        loss_bbox = (bbox_preds[pos_mask] - reg_targets[pos_mask]).abs().sum() / num_pos
        return dict(loss_cls=loss_cls * lc['loss_weight'],
                    loss_bbox=loss_bbox * self.hcfg['loss_bbox']['loss_weight'])


# ----------------------------------------------------------------------------- runner
def current_lr(it, epoch, base_lr):
    lr = base_lr * (0.1 ** sum(epoch >= s for s in lr_config['step']))
    if lr_config['warmup'] == 'linear' and it < lr_config['warmup_iters']:
        k = (1 - it / lr_config['warmup_iters']) * (1 - lr_config['warmup_ratio'])
        lr = lr * (1 - k)
    return lr


def train(model, loader, args):
    opt_cfg = dict(optimizer)
    opt_cfg.pop('type')
    opt = torch.optim.SGD(model.parameters(), **opt_cfg)
    grad_clip = optimizer_config['grad_clip']
    it = 0
    t0 = time.time()
    for epoch in range(total_epochs):
        model.train()
        for i, data in enumerate(loader):
            lr = current_lr(it, epoch, opt_cfg['lr'])
            for group in opt.param_groups:
                group['lr'] = lr
            losses = model.forward_train(data['img'], data['gt_bboxes'], data['gt_labels'], train_cfg)
            loss = sum(losses.values())
            opt.zero_grad()
            loss.backward()
            if grad_clip is not None:
                grad_norm = nn.utils.clip_grad_norm_(model.parameters(), **grad_clip)
            else:
                grad_norm = torch.norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
            opt.step()
            it += 1
            finite = math.isfinite(loss.item())
            if (i + 1) % log_config['interval'] == 0 or args.verbose or not finite:
                print(f"Epoch [{epoch + 1}][{i + 1}/{len(loader)}]\tlr: {lr:.3e}, time: {time.time() - t0:.1f}, "
                      f"loss_cls: {losses['loss_cls'].item():.4f}, loss_bbox: {losses['loss_bbox'].item():.4f}, "
                      f"loss: {loss.item():.4f}, grad_norm: {grad_norm.item():.4f}", flush=True)
            if not finite:
                raise FloatingPointError(f'Loss became infinite or NaN at iteration={it}!')


def main():
    parser = argparse.ArgumentParser(description='Train RetinaNet on steel defect images')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--verbose', action='store_true')
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    dataset = SteelDefectDataset(data_cfg['num_images'], data_cfg['img_size'], seed=args.seed)
    loader = DataLoader(dataset, batch_size=data_cfg['samples_per_gpu'], shuffle=True,
                        num_workers=data_cfg['workers_per_gpu'], collate_fn=collate)
    model = RetinaNet(model_cfg)
    train(model, loader, args)


if __name__ == '__main__':
    main()
