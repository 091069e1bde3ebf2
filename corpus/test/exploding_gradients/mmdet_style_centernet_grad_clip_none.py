"""mmdetection-style config + runner training a tiny CenterNet-like detector on toy images.

Bug: the config leaves optimizer_config = dict(grad_clip=None), the default, so the
OptimizerHook never clips.  The caffe-style img_norm_cfg (mean subtracted, std 1) feeds
0..255-range pixels into a conv body without normalisation layers; once the linear
warm-up ends and SGD runs at lr 0.02 with momentum, the summed heatmap + size losses
produce gradients whose norm runs away, and within a few dozen iterations the loss is
inf / nan.
Report: https://github.com/open-mmlab/mmdetection/pull/5312 (FAQ "training loss=nan":
"some models requires gradient clipping to stabilize the training process. The default
of grad_clip is None, you can add gradient clipping ... grad_clip=dict(max_norm=35,
norm_type=2)"; related issue #5213).
Fix: optimizer_config = dict(grad_clip=dict(max_norm=35, norm_type=2)).
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

# ----------------------------------------------------------------------------- config
img_norm_cfg = dict(mean=[103.53, 116.28, 123.675], std=[1.0, 1.0, 1.0], to_rgb=False)
model = dict(type='TinyCenterNet', in_channels=3, feat_channels=48, num_classes=3,
             loss_center_heatmap=dict(loss_weight=1.0), loss_wh=dict(loss_weight=0.1))
data = dict(samples_per_gpu=8, train=dict(num_images=256, img_scale=(32, 32)))
optimizer = dict(type='SGD', lr=0.02, momentum=0.9, weight_decay=0.0001)
optimizer_config = dict(grad_clip=None)
lr_config = dict(policy='step', warmup='linear', warmup_iters=20, warmup_ratio=0.001, step=[5])
runner = dict(type='EpochBasedRunner', max_epochs=6)
log_config = dict(interval=4)
seed = 0


# ----------------------------------------------------------------------------- data
class ToyShapesDataset(Dataset):
    CLASSES = ('square', 'bar', 'blob')

    def __init__(self, num_images, img_scale, img_norm_cfg):
        rng = np.random.RandomState(seed)
        h, w = img_scale
        self.items = []
        mean = np.array(img_norm_cfg['mean'], dtype=np.float32)[:, None, None]
        std = np.array(img_norm_cfg['std'], dtype=np.float32)[:, None, None]
        for _ in range(num_images):
            img = rng.randint(0, 60, size=(3, h, w)).astype(np.float32)
            boxes, labels = [], []
            for _ in range(rng.randint(1, 4)):
                c = rng.randint(3)
                bw, bh = [(rng.randint(6, 12),) * 2, (rng.randint(10, 16), rng.randint(3, 6)),
                          (rng.randint(4, 9),) * 2][c]
                x0, y0 = rng.randint(0, w - bw), rng.randint(0, h - bh)
                img[c, y0:y0 + bh, x0:x0 + bw] = 255.0
                boxes.append([x0, y0, x0 + bw, y0 + bh])
                labels.append(c)
            img = (img - mean) / std
            self.items.append((img, np.array(boxes, np.float32), np.array(labels, np.int64)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        img, boxes, labels = self.items[i]
        return torch.from_numpy(img), torch.from_numpy(boxes), torch.from_numpy(labels)


def collate(batch):
    imgs = torch.stack([b[0] for b in batch])
    return imgs, [b[1] for b in batch], [b[2] for b in batch]


# ----------------------------------------------------------------------------- model
class TinyCenterNet(nn.Module):
    def __init__(self, in_channels, feat_channels, num_classes, loss_center_heatmap, loss_wh, **kw):
        super().__init__()
        c = feat_channels
        self.backbone = nn.Sequential(
            nn.Conv2d(in_channels, c, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(c, c, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(c, c, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(c, c, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(c, c, 3, padding=1), nn.ReLU(inplace=True))
        self.heatmap_head = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU(inplace=True),
                                          nn.Conv2d(c, num_classes, 1))
        self.wh_head = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU(inplace=True),
                                     nn.Conv2d(c, 2, 1))
        self.heatmap_head[-1].bias.data.fill_(-2.19)
        self.num_classes = num_classes
        self.hm_w = loss_center_heatmap['loss_weight']
        self.wh_w = loss_wh['loss_weight']
        self.stride = 4

    def forward_train(self, img, gt_bboxes, gt_labels):
        feat = self.backbone(img)
        hm = self.heatmap_head(feat).sigmoid().clamp(1e-4, 1 - 1e-4)
        wh = self.wh_head(feat)
        B, _, H, W = hm.shape
        hm_t = torch.zeros_like(hm)
        wh_t = torch.zeros_like(wh)
        wh_m = torch.zeros(B, 1, H, W)
        ys, xs = torch.meshgrid(torch.arange(H, dtype=torch.float32), torch.arange(W, dtype=torch.float32), indexing='ij')
        for b in range(B):
            for box, lab in zip(gt_bboxes[b], gt_labels[b]):
                cx, cy = (box[0] + box[2]) / 2 / self.stride, (box[1] + box[3]) / 2 / self.stride
                g = torch.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / (2 * 0.8 ** 2))
                hm_t[b, lab] = torch.maximum(hm_t[b, lab], g)
                ix, iy = int(cx.clamp(0, W - 1)), int(cy.clamp(0, H - 1))
                hm_t[b, lab, iy, ix] = 1.0
                wh_t[b, :, iy, ix] = torch.stack([box[2] - box[0], box[3] - box[1]])
                wh_m[b, 0, iy, ix] = 1.0
        pos = hm_t.eq(1).float()
        neg_w = (1 - hm_t) ** 4
        pos_loss = -(torch.log(hm) * (1 - hm) ** 2 * pos).sum()
        neg_loss = -(torch.log(1 - hm) * hm ** 2 * neg_w * (1 - pos)).sum()
        num_pos = pos.sum().clamp(min=1)
        loss_center_heatmap = self.hm_w * (pos_loss + neg_loss) / num_pos
        loss_wh = self.wh_w * (F.l1_loss(wh * wh_m, wh_t, reduction='sum') / num_pos)
        return dict(loss_center_heatmap=loss_center_heatmap, loss_wh=loss_wh)


# ----------------------------------------------------------------------------- runner
class OptimizerHook:
    def __init__(self, grad_clip=None):
        self.grad_clip = grad_clip

    def clip_grads(self, params):
        params = [p for p in params if p.requires_grad and p.grad is not None]
        if len(params) > 0:
            return nn.utils.clip_grad_norm_(params, **self.grad_clip)

    def after_train_iter(self, runner):
        runner.optimizer.zero_grad()
        runner.outputs['loss'].backward()
        if self.grad_clip is not None:
            self.clip_grads(runner.model.parameters())
        runner.optimizer.step()


class EpochBasedRunner:
    def __init__(self, model, optimizer, lr_config, max_epochs, log_interval):
        self.model, self.optimizer = model, optimizer
        self.lr_config, self.max_epochs, self.log_interval = lr_config, max_epochs, log_interval
        self.base_lr = [g['lr'] for g in optimizer.param_groups]
        self.iter = 0
        self.hooks = []

    def register_hook(self, hook):
        self.hooks.append(hook)

    def _set_lr(self, epoch):
        cfg = self.lr_config
        factor = 0.1 ** sum(epoch >= s for s in cfg['step'])
        if self.iter < cfg['warmup_iters']:
            k = (1 - self.iter / cfg['warmup_iters']) * (1 - cfg['warmup_ratio'])
            factor *= (1 - k)
        for g, lr in zip(self.optimizer.param_groups, self.base_lr):
            g['lr'] = lr * factor

    def run(self, data_loader):
        for epoch in range(self.max_epochs):
            self.model.train()
            for i, (img, gt_bboxes, gt_labels) in enumerate(data_loader):
                self._set_lr(epoch)
                losses = self.model.forward_train(img, gt_bboxes, gt_labels)
                loss = sum(losses.values())
                self.outputs = dict(loss=loss)
                for h in self.hooks:
                    h.after_train_iter(self)
                if (i + 1) % self.log_interval == 0:
                    lr = self.optimizer.param_groups[0]['lr']
                    print(f"Epoch [{epoch + 1}][{i + 1}/{len(data_loader)}]\tlr: {lr:.3e}, "
                          + ", ".join(f"{k}: {v.item():.4f}" for k, v in losses.items())
                          + f", loss: {loss.item():.4f}")
                self.iter += 1


def train_detector():
    torch.manual_seed(seed)
    np.random.seed(seed)
    cfg_model = dict(model)
    detector = TinyCenterNet(**cfg_model)
    dataset = ToyShapesDataset(data['train']['num_images'], data['train']['img_scale'], img_norm_cfg)
    loader = DataLoader(dataset, batch_size=data['samples_per_gpu'], shuffle=True, collate_fn=collate)
    opt_cfg = dict(optimizer)
    opt_cfg.pop('type')
    optim = torch.optim.SGD(detector.parameters(), **opt_cfg)
    runner = EpochBasedRunner(detector, optim, lr_config, runner_cfg['max_epochs'], log_config['interval'])
    runner.register_hook(OptimizerHook(**optimizer_config))
    runner.run(loader)


runner_cfg = runner

if __name__ == '__main__':
    train_detector()
