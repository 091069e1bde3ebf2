"""RetinaNet with a ResNet-18 backbone, mmdet ``schedule_1x`` optimizer, ``grad_clip=None``.

Reproduces https://github.com/open-mmlab/mmdetection/issues/4292 ("Training FCOS and RetinaNet
using multiple GPUs, each loss = nan").  The reporter trained RetinaNet / FCOS with a ResNet-18
backbone (SGD, lr=0.01, 2 images per GPU, warmup) and saw the losses turn to nan after 50-300
iterations; ``loss_cls`` first jumped to inf or above 1e4, then every loss was nan, and only about
one run in ten converged.  The config inherits ``_base_/schedules/schedule_1x.py`` whose
``optimizer_config = dict(grad_clip=None)``, so nothing bounds a single SGD step.  The backbone
runs with frozen BN statistics (``norm_eval=True`` as in the RetinaNet base config; here it is
trained from scratch, so BN is the identity), the gradient norm of the whole detector spikes
(about 100 -> 1300 -> 1.9e6 here), one unclipped step throws the weights so far that
``loss_cls`` reads about 2.5e4, and on the next forward the FPN features overflow and every loss
is nan.

Maintainer fix (yhcao6): "To avoid NaN at the beginning, you can try to add grad_clip", pointing
at the FCOS config line ``optimizer_config = dict(_delete_=True, grad_clip=dict(max_norm=35,
norm_type=2))``; the learning rate (0.01) stays as it is.

Written in the mmdet 2.x ``tools/train.py`` idiom: an mmcv-like ``Config`` with attribute access,
``build_detector`` / ``build_optimizer``, a runner that registers an ``OptimizerHook`` built from
``cfg.optimizer_config`` and an ``LrUpdaterHook`` with linear warmup, and the text logger format
``Epoch [e][i/n] lr: ..., loss_cls: ..., loss_bbox: ..., loss: ...``.  Synthetic data: random
images with a few filled boxes of 5 classes.
"""
import argparse
import math
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Config(dict):
    """Tiny stand-in for ``mmcv.Config``: nested dicts with attribute access."""

    def __getattr__(self, name):
        value = self[name]
        return Config(value) if isinstance(value, dict) and not isinstance(value, Config) else value


# ------------------------------------------------------------------------ configs/retinanet_r18
_cfg = dict(
    model=dict(
        type='RetinaNet',
        backbone=dict(type='ResNet', depth=18, base_channels=16, num_stages=4,
                      out_indices=(1, 2, 3), norm_eval=True),
        neck=dict(type='FPN', in_channels=[32, 64, 128], out_channels=32, num_outs=3),
        bbox_head=dict(
            type='RetinaHead', num_classes=5, in_channels=32, stacked_convs=2, feat_channels=32,
            anchor_generator=dict(octave_base_scale=4, scales_per_octave=2,
                                  ratios=[0.5, 1.0, 2.0], strides=[8, 16, 32]),
            bbox_coder=dict(target_means=[0., 0., 0., 0.], target_stds=[0.1, 0.1, 0.2, 0.2]),
            loss_cls=dict(type='FocalLoss', gamma=2.0, alpha=0.25, loss_weight=1.0),
            loss_bbox=dict(type='L1Loss', loss_weight=1.0)),
        train_cfg=dict(assigner=dict(pos_iou_thr=0.5, neg_iou_thr=0.4, min_pos_iou=0))),
    img_norm_cfg=dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]),
    data=dict(samples_per_gpu=4, workers_per_gpu=0, num_images=320, img_size=96),
    # _base_/schedules/schedule_1x.py
    optimizer=dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0001),
    optimizer_config=dict(grad_clip=None),
    lr_config=dict(policy='step', warmup='linear', warmup_iters=50, warmup_ratio=0.001, step=[8, 11]),
    total_epochs=3,
    log_config=dict(interval=10),
    seed=42,
)


# ------------------------------------------------------------------------ dataset
class ToyDetDataset(torch.utils.data.Dataset):
    CLASSES = ('car', 'person', 'bicycle', 'dog', 'bus')

    def __init__(self, num_images, img_size, img_norm_cfg, seed):
        rng = np.random.RandomState(seed)
        mean = np.array(img_norm_cfg['mean'], np.float32)
        std = np.array(img_norm_cfg['std'], np.float32)
        self.items = []
        for _ in range(num_images):
            img = rng.randint(0, 256, size=(img_size, img_size, 3)).astype(np.float32)
            boxes, labels = [], []
            for _ in range(rng.randint(1, 4)):
                w, h = rng.randint(8, 60), rng.randint(8, 60)
                x1, y1 = rng.randint(0, img_size - w), rng.randint(0, img_size - h)
                c = rng.randint(len(self.CLASSES))
                img[y1:y1 + h, x1:x1 + w] = 40 + 50 * c
                boxes.append([x1, y1, x1 + w, y1 + h])
                labels.append(c)
            img = (img - mean) / std
            self.items.append((torch.from_numpy(img.transpose(2, 0, 1).copy()),
                               torch.tensor(boxes, dtype=torch.float32),
                               torch.tensor(labels, dtype=torch.long)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        img, boxes, labels = self.items[i]
        return dict(img=img, gt_bboxes=boxes, gt_labels=labels)


def collate(batch):
    return dict(img=torch.stack([b['img'] for b in batch]),
                gt_bboxes=[b['gt_bboxes'] for b in batch],
                gt_labels=[b['gt_labels'] for b in batch])


# ------------------------------------------------------------------------ mmdet/models
class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class ResNet(nn.Module):
    arch_settings = {18: (2, 2, 2, 2), 10: (1, 1, 1, 1)}

    def __init__(self, depth, base_channels, num_stages, out_indices, norm_eval):
        super().__init__()
        stage_blocks = self.arch_settings[depth][:num_stages]
        self.out_indices = out_indices
        self.norm_eval = norm_eval
        self.stem = nn.Sequential(nn.Conv2d(3, base_channels, 7, 2, 3, bias=False),
                                  nn.BatchNorm2d(base_channels), nn.ReLU(inplace=True))
        layers, inplanes = [], base_channels
        for i, num_blocks in enumerate(stage_blocks):
            planes = base_channels * 2 ** i
            blocks = [BasicBlock(inplanes, planes, stride=1 if i == 0 else 2)]
            blocks += [BasicBlock(planes, planes) for _ in range(num_blocks - 1)]
            layers.append(nn.Sequential(*blocks))
            inplanes = planes
        self.res_layers = nn.ModuleList(layers)
        for m in self.modules():                     # mmcv kaiming_init / constant_init
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def train(self, mode=True):
        super().train(mode)
        if mode and self.norm_eval:                 # keep BN statistics frozen, as in mmdet
            for m in self.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.eval()
        return self

    def forward(self, x):
        x = self.stem(x)
        outs = []
        for i, layer in enumerate(self.res_layers):
            x = layer(x)
            if i in self.out_indices:
                outs.append(x)
        return tuple(outs)


class FPN(nn.Module):
    def __init__(self, in_channels, out_channels, num_outs):
        super().__init__()
        self.lateral_convs = nn.ModuleList(nn.Conv2d(c, out_channels, 1) for c in in_channels)
        self.fpn_convs = nn.ModuleList(nn.Conv2d(out_channels, out_channels, 3, padding=1)
                                       for _ in in_channels)
        for m in self.modules():                     # mmcv xavier_init(distribution='uniform')
            if isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(m.weight)
                nn.init.constant_(m.bias, 0)

    def forward(self, inputs):
        laterals = [conv(x) for conv, x in zip(self.lateral_convs, inputs)]
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + F.interpolate(laterals[i], size=laterals[i - 1].shape[2:])
        return tuple(conv(l) for conv, l in zip(self.fpn_convs, laterals))


def bbox_overlaps(a, b):
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / (area_a[:, None] + area_b[None] - inter)


def bbox2delta(proposals, gt, means, stds):
    pw, ph = proposals[:, 2] - proposals[:, 0], proposals[:, 3] - proposals[:, 1]
    px, py = proposals[:, 0] + 0.5 * pw, proposals[:, 1] + 0.5 * ph
    gw, gh = gt[:, 2] - gt[:, 0], gt[:, 3] - gt[:, 1]
    gx, gy = gt[:, 0] + 0.5 * gw, gt[:, 1] + 0.5 * gh
    deltas = torch.stack([(gx - px) / pw, (gy - py) / ph, torch.log(gw / pw), torch.log(gh / ph)], -1)
    return (deltas - deltas.new_tensor(means)) / deltas.new_tensor(stds)


class RetinaHead(nn.Module):
    def __init__(self, num_classes, in_channels, stacked_convs, feat_channels, anchor_generator,
                 bbox_coder, loss_cls, loss_bbox, train_cfg):
        super().__init__()
        self.num_classes = num_classes
        self.ag = anchor_generator
        self.coder = bbox_coder
        self.focal = loss_cls
        self.assigner = train_cfg['assigner']
        self.num_anchors = len(anchor_generator['ratios']) * anchor_generator['scales_per_octave']
        self.cls_convs = nn.ModuleList()
        self.reg_convs = nn.ModuleList()
        for i in range(stacked_convs):
            ch = in_channels if i == 0 else feat_channels
            self.cls_convs.append(nn.Conv2d(ch, feat_channels, 3, padding=1))
            self.reg_convs.append(nn.Conv2d(ch, feat_channels, 3, padding=1))
        self.retina_cls = nn.Conv2d(feat_channels, self.num_anchors * num_classes, 3, padding=1)
        self.retina_reg = nn.Conv2d(feat_channels, self.num_anchors * 4, 3, padding=1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.constant_(m.bias, 0)
        nn.init.constant_(self.retina_cls.bias, -math.log((1 - 0.01) / 0.01))

    def forward_single(self, x):
        cls_feat, reg_feat = x, x
        for conv in self.cls_convs:
            cls_feat = F.relu(conv(cls_feat))
        for conv in self.reg_convs:
            reg_feat = F.relu(conv(reg_feat))
        return self.retina_cls(cls_feat), self.retina_reg(reg_feat)

    def anchors(self, featmap_sizes):
        all_anchors = []
        for (h, w), stride in zip(featmap_sizes, self.ag['strides']):
            base = []
            for ratio in self.ag['ratios']:
                for s in range(self.ag['scales_per_octave']):
                    size = stride * self.ag['octave_base_scale'] * 2 ** (s / self.ag['scales_per_octave'])
                    hr, wr = math.sqrt(ratio), 1 / math.sqrt(ratio)
                    base.append([-0.5 * size * wr, -0.5 * size * hr, 0.5 * size * wr, 0.5 * size * hr])
            base = torch.tensor(base)
            ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing='ij')
            shifts = torch.stack([xs, ys, xs, ys], -1).reshape(-1, 1, 4).float() * stride
            all_anchors.append((shifts + base[None]).reshape(-1, 4))
        return torch.cat(all_anchors)

    def loss(self, cls_scores, bbox_preds, gt_bboxes, gt_labels):
        anchors = self.anchors([c.shape[-2:] for c in cls_scores])
        n = cls_scores[0].shape[0]
        flat_cls = torch.cat([c.permute(0, 2, 3, 1).reshape(n, -1, self.num_classes) for c in cls_scores], 1)
        flat_reg = torch.cat([r.permute(0, 2, 3, 1).reshape(n, -1, 4) for r in bbox_preds], 1)
        cls_targets, reg_targets, pos_masks, valid_masks = [], [], [], []
        for boxes, labels in zip(gt_bboxes, gt_labels):
            ious = bbox_overlaps(anchors, boxes)
            max_iou, argmax = ious.max(1)
            pos = max_iou >= self.assigner['pos_iou_thr']
            gt_best = ious.argmax(0)                       # min_pos_iou=0: every gt gets its best anchor
            pos[gt_best] = True
            argmax[gt_best] = torch.arange(len(boxes))
            neg = (max_iou < self.assigner['neg_iou_thr']) & ~pos
            t = torch.zeros(len(anchors), self.num_classes)
            t[pos, labels[argmax[pos]]] = 1.0
            cls_targets.append(t)
            reg_targets.append(bbox2delta(anchors, boxes[argmax], self.coder['target_means'],
                                          self.coder['target_stds']))
            pos_masks.append(pos)
            valid_masks.append(pos | neg)
        cls_t, reg_t = torch.stack(cls_targets), torch.stack(reg_targets)
        pos_m, valid_m = torch.stack(pos_masks), torch.stack(valid_masks)
        num_pos = max(pos_m.sum().item(), 1)
        p = flat_cls.sigmoid()
        pt = (1 - p) * cls_t + p * (1 - cls_t)
        w = (self.focal['alpha'] * cls_t + (1 - self.focal['alpha']) * (1 - cls_t)) * pt.pow(self.focal['gamma'])
        focal = F.binary_cross_entropy_with_logits(flat_cls, cls_t, reduction='none') * w
        loss_cls = focal[valid_m].sum() / num_pos
        loss_bbox = (flat_reg[pos_m] - reg_t[pos_m]).abs().sum() / num_pos
        return dict(loss_cls=loss_cls, loss_bbox=loss_bbox)


class RetinaNet(nn.Module):
    def __init__(self, backbone, neck, bbox_head, train_cfg):
        super().__init__()
        backbone, neck, bbox_head = dict(backbone), dict(neck), dict(bbox_head)
        backbone.pop('type'), neck.pop('type'), bbox_head.pop('type')
        self.backbone = ResNet(**backbone)
        self.neck = FPN(**neck)
        self.bbox_head = RetinaHead(**bbox_head, train_cfg=train_cfg)

    def train_step(self, data):
        feats = self.neck(self.backbone(data['img']))
        outs = [self.bbox_head.forward_single(f) for f in feats]
        cls_scores, bbox_preds = zip(*outs)
        losses = self.bbox_head.loss(cls_scores, bbox_preds, data['gt_bboxes'], data['gt_labels'])
        loss = losses['loss_cls'] + losses['loss_bbox']
        log_vars = dict(loss_cls=losses['loss_cls'].item(), loss_bbox=losses['loss_bbox'].item(),
                        loss=loss.item())
        return dict(loss=loss, log_vars=log_vars)


def build_detector(cfg):
    cfg = dict(cfg)
    assert cfg.pop('type') == 'RetinaNet'
    return RetinaNet(**cfg)


def build_optimizer(model, cfg):
    cfg = dict(cfg)
    return getattr(torch.optim, cfg.pop('type'))(model.parameters(), **cfg)


# ------------------------------------------------------------------------ mmcv/runner
class OptimizerHook:
    def __init__(self, grad_clip=None):
        self.grad_clip = grad_clip

    def after_train_iter(self, runner):
        runner.optimizer.zero_grad()
        runner.outputs['loss'].backward()
        if self.grad_clip is not None:
            params = [p for p in runner.model.parameters() if p.grad is not None]
            grad_norm = nn.utils.clip_grad_norm_(params, **self.grad_clip)
            runner.outputs['log_vars']['grad_norm'] = float(grad_norm)
        runner.optimizer.step()


class LrUpdaterHook:
    def __init__(self, policy, warmup, warmup_iters, warmup_ratio, step):
        self.warmup_iters, self.warmup_ratio, self.step = warmup_iters, warmup_ratio, step

    def before_train_iter(self, runner):
        lr_factor = 0.1 ** sum(runner.epoch >= s for s in self.step)
        if runner.iter < self.warmup_iters:
            k = (1 - runner.iter / self.warmup_iters) * (1 - self.warmup_ratio)
            lr_factor *= (1 - k)
        for group, base_lr in zip(runner.optimizer.param_groups, runner.base_lrs):
            group['lr'] = base_lr * lr_factor


class EpochBasedRunner:
    def __init__(self, model, optimizer, log_interval):
        self.model, self.optimizer, self.log_interval = model, optimizer, log_interval
        self.base_lrs = [g['lr'] for g in optimizer.param_groups]
        self.hooks = []
        self.epoch = self.iter = 0

    def register_training_hooks(self, lr_config, optimizer_config):
        self.hooks = [LrUpdaterHook(**lr_config), OptimizerHook(**optimizer_config)]

    def run(self, data_loader, max_epochs):
        for self.epoch in range(max_epochs):
            self.model.train()
            for i, data in enumerate(data_loader):
                self.hooks[0].before_train_iter(self)
                self.outputs = self.model.train_step(data)
                self.hooks[1].after_train_iter(self)
                self.iter += 1
                if (i + 1) % self.log_interval == 0:
                    lv = self.outputs['log_vars']
                    print(f"Epoch [{self.epoch + 1}][{i + 1}/{len(data_loader)}]\t"
                          f"lr: {self.optimizer.param_groups[0]['lr']:.3e}, "
                          + ', '.join(f'{k}: {v:.4f}' for k, v in lv.items()), flush=True)


def train_detector(model, dataset, cfg):
    data_loader = torch.utils.data.DataLoader(
        dataset, batch_size=cfg.data.samples_per_gpu, shuffle=True, collate_fn=collate,
        num_workers=cfg.data.workers_per_gpu, generator=torch.Generator().manual_seed(cfg.seed))
    optimizer = build_optimizer(model, cfg.optimizer)
    runner = EpochBasedRunner(model, optimizer, cfg.log_config.interval)
    runner.register_training_hooks(cfg.lr_config, cfg.optimizer_config)
    runner.run(data_loader, cfg.total_epochs)


# ------------------------------------------------------------------------ tools/train.py
def parse_args():
    parser = argparse.ArgumentParser(description='Train a detector')
    parser.add_argument('--seed', type=int, default=None)
    return parser.parse_args()


def main():
    args = parse_args()
    cfg = Config(_cfg)
    if args.seed is not None:
        cfg['seed'] = args.seed
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(2)
    model = build_detector(cfg.model)
    dataset = ToyDetDataset(cfg.data.num_images, cfg.data.img_size, cfg.img_norm_cfg, cfg.seed)
    train_detector(model, dataset, cfg)


if __name__ == '__main__':
    main()
