"""FCOS trained on a VOC-style dataset with the RetinaNet optimizer settings and no gradient clipping.

Reproduces https://github.com/open-mmlab/mmdetection/issues/5963 ("When I train FCOS on VOC,
loss always is Nan").  The reporter trained RetinaNet on VOC0712 without trouble, then took
``fcos_r50_caffe_fpn_4x4_1x_coco.py`` (caffe-style normalisation: mean subtraction, std = 1.0, so
pixels stay in the +-128 range; FCOS head with ``norm_cfg=None``), set ``num_classes=20`` and used
the optimizer of ``retinanet_r50_fpn_1x_voc0712.py`` (SGD, lr=0.01, momentum=0.9, wd=1e-4).  The
FCOS config ships ``optimizer_config = dict(_delete_=True, grad_clip=dict(max_norm=35))``, but the
RetinaNet/VOC schedule it was swapped for has ``optimizer_config = dict(grad_clip=None)``.  Without
clipping the gradient norm spikes (to ~100-400 here) every few dozen iterations, each unclipped
SGD step at lr=0.01 pushes the regression branch further, until ``exp()`` of the regression
logits overflows to inf; the backward of exp then turns the zero gradients of the non-positive
locations into 0 * inf = NaN, the step writes NaN into every weight and all losses print nan.

Maintainer fix (jshilong): use ``grad_clip`` like the fsaf config,
``optimizer_config = dict(_delete_=True, grad_clip=dict(max_norm=10, norm_type=2))`` -- the
reporter confirmed "I success to train fcos on VOC" with that line and the same lr=0.01.

Written in the mmdet 2.x idiom: a config dict, a tiny model registry / builder, an
``OptimizerHook`` that clips only when ``grad_clip`` is set, and an iteration logger that prints
``loss_cls / loss_bbox / loss_centerness / loss`` like the mmdet text logger.  Data are synthetic
VOC-like images (coloured rectangles on noise, 20 classes).
"""
import math
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------- config
img_norm_cfg = dict(mean=[102.9801, 115.9465, 122.7717], std=[1.0, 1.0, 1.0], to_rgb=False)
model = dict(
    type='FCOS',
    backbone=dict(type='TinyResNet', depth=4, base_channels=32),
    bbox_head=dict(
        type='FCOSHead',
        num_classes=20,
        in_channels=64,
        stacked_convs=2,
        feat_channels=64,
        strides=[8],
        norm_cfg=None,
        loss_cls=dict(type='FocalLoss', gamma=2.0, alpha=0.25, loss_weight=1.0),
        loss_bbox=dict(type='IoULoss', loss_weight=1.0),
        loss_centerness=dict(type='CrossEntropyLoss', use_sigmoid=True, loss_weight=1.0)))
data = dict(samples_per_gpu=4, workers_per_gpu=0, img_size=64, num_images=400)
# optimizer (copied from retinanet_r50_fpn_1x_voc0712.py)
optimizer = dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=0.0001)
optimizer_config = dict(grad_clip=None)
lr_config = dict(policy='step', warmup='constant', warmup_iters=20, warmup_ratio=1.0 / 3, step=[3])
total_epochs = 2
log_config = dict(interval=10)
seed = 0

cfg = dict(model=model, data=data, optimizer=optimizer, optimizer_config=optimizer_config,
           lr_config=lr_config, total_epochs=total_epochs, log_config=log_config,
           img_norm_cfg=img_norm_cfg, seed=seed)

# ----------------------------------------------------------------------------- registry
MODELS = {}


def register_module(cls):
    MODELS[cls.__name__] = cls
    return cls


def build(cfg_dict, **kwargs):
    args = dict(cfg_dict)
    obj_type = args.pop('type')
    args.update(kwargs)
    return MODELS[obj_type](**args)


# ----------------------------------------------------------------------------- dataset
VOC_CLASSES = ('aeroplane', 'bicycle', 'bird', 'boat', 'bottle', 'bus', 'car', 'cat', 'chair',
               'cow', 'diningtable', 'dog', 'horse', 'motorbike', 'person', 'pottedplant',
               'sheep', 'sofa', 'train', 'tvmonitor')


class SyntheticVOCDataset(torch.utils.data.Dataset):
    CLASSES = VOC_CLASSES

    def __init__(self, num_images, img_size, img_norm_cfg, seed=0):
        rng = np.random.RandomState(seed)
        self.mean = np.array(img_norm_cfg['mean'], dtype=np.float32)
        self.std = np.array(img_norm_cfg['std'], dtype=np.float32)
        self.samples = []
        for _ in range(num_images):
            img = rng.uniform(0, 255, size=(img_size, img_size, 3)).astype(np.float32) * 0.3
            boxes, labels = [], []
            for _ in range(rng.randint(1, 4)):
                w, h = rng.randint(12, 40), rng.randint(12, 40)
                x1, y1 = rng.randint(0, img_size - w), rng.randint(0, img_size - h)
                label = rng.randint(len(self.CLASSES))
                colour = (np.array([label * 12, 255 - label * 9, (label * 37) % 255]))
                img[y1:y1 + h, x1:x1 + w] = colour
                boxes.append([x1, y1, x1 + w, y1 + h])
                labels.append(label)
            self.samples.append((img, np.array(boxes, np.float32), np.array(labels, np.int64)))

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, idx):
        img, boxes, labels = self.samples[idx]
        img = (img - self.mean) / self.std          # Normalize(**img_norm_cfg)
        img = torch.from_numpy(img.transpose(2, 0, 1).copy())
        return dict(img=img, gt_bboxes=torch.from_numpy(boxes), gt_labels=torch.from_numpy(labels))


def collate(batch):
    return dict(img=torch.stack([b['img'] for b in batch]),
                gt_bboxes=[b['gt_bboxes'] for b in batch],
                gt_labels=[b['gt_labels'] for b in batch])


# ----------------------------------------------------------------------------- model
@register_module
class TinyResNet(nn.Module):
    def __init__(self, depth, base_channels):
        super().__init__()
        c = base_channels
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.ReLU(inplace=True))
        self.layer1 = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1), nn.ReLU(inplace=True))
        self.layer2 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, 2, 1), nn.ReLU(inplace=True))
        self.layer3 = nn.Sequential(nn.Conv2d(2 * c, 2 * c, 3, 2, 1), nn.ReLU(inplace=True))

    def forward(self, x):
        x = self.stem(x)
        x = self.layer1(x) + x
        x = self.layer2(x)
        return self.layer3(x)


class Scale(nn.Module):
    def __init__(self, scale=1.0):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(scale, dtype=torch.float))

    def forward(self, x):
        return x * self.scale


def sigmoid_focal_loss(pred, target, gamma, alpha):
    p = pred.sigmoid()
    pt = (1 - p) * target + p * (1 - target)
    w = (alpha * target + (1 - alpha) * (1 - target)) * pt.pow(gamma)
    return F.binary_cross_entropy_with_logits(pred, target, reduction='none') * w


def iou_loss(pred, target, eps=1e-6):
    # pred / target: (l, t, r, b) distances
    pl, pt, pr, pb = pred.unbind(-1)
    tl, tt, tr, tb = target.unbind(-1)
    pred_area = (pl + pr) * (pt + pb)
    target_area = (tl + tr) * (tt + tb)
    w_inter = torch.min(pl, tl) + torch.min(pr, tr)
    h_inter = torch.min(pt, tt) + torch.min(pb, tb)
    inter = w_inter * h_inter
    ious = (inter / (pred_area + target_area - inter)).clamp(min=eps)
    return -ious.log()


@register_module
class FCOSHead(nn.Module):
    INF = 1e8

    def __init__(self, num_classes, in_channels, stacked_convs, feat_channels, strides,
                 loss_cls, loss_bbox, loss_centerness, norm_cfg=dict(type='GN', num_groups=32)):
        super().__init__()
        self.num_classes = num_classes
        self.strides = strides
        self.loss_cls_cfg = loss_cls
        cls_convs, reg_convs = [], []
        for i in range(stacked_convs):
            ch = in_channels if i == 0 else feat_channels
            for convs in (cls_convs, reg_convs):
                convs.append(nn.Conv2d(ch, feat_channels, 3, padding=1, bias=norm_cfg is None))
                if norm_cfg is not None:
                    convs.append(nn.GroupNorm(norm_cfg['num_groups'], feat_channels))
                convs.append(nn.ReLU(inplace=True))
        self.cls_convs = nn.Sequential(*cls_convs)
        self.reg_convs = nn.Sequential(*reg_convs)
        self.conv_cls = nn.Conv2d(feat_channels, num_classes, 3, padding=1)
        self.conv_reg = nn.Conv2d(feat_channels, 4, 3, padding=1)
        self.conv_centerness = nn.Conv2d(feat_channels, 1, 3, padding=1)
        self.scales = nn.ModuleList([Scale(1.0) for _ in strides])
        self.init_weights()

    def init_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.constant_(m.bias, 0)
        bias_cls = float(-math.log((1 - 0.01) / 0.01))
        nn.init.constant_(self.conv_cls.bias, bias_cls)

    def forward(self, feat):
        cls_feat = self.cls_convs(feat)
        reg_feat = self.reg_convs(feat)
        cls_score = self.conv_cls(cls_feat)
        centerness = self.conv_centerness(cls_feat)
        bbox_pred = self.scales[0](self.conv_reg(reg_feat)).float().exp()
        return cls_score, bbox_pred, centerness

    def get_targets(self, points, gt_bboxes_list, gt_labels_list):
        labels, bbox_targets = [], []
        for gt_bboxes, gt_labels in zip(gt_bboxes_list, gt_labels_list):
            xs, ys = points[:, 0][:, None], points[:, 1][:, None]
            left = xs - gt_bboxes[:, 0]
            right = gt_bboxes[:, 2] - xs
            top = ys - gt_bboxes[:, 1]
            bottom = gt_bboxes[:, 3] - ys
            bbox_t = torch.stack((left, top, right, bottom), -1)
            inside = bbox_t.min(-1).values > 0
            areas = ((gt_bboxes[:, 2] - gt_bboxes[:, 0]) * (gt_bboxes[:, 3] - gt_bboxes[:, 1]))
            areas = areas[None].repeat(len(points), 1)
            areas[~inside] = self.INF
            min_area, min_area_inds = areas.min(dim=1)
            label = gt_labels[min_area_inds].clone()
            label[min_area == self.INF] = self.num_classes
            labels.append(label)
            bbox_targets.append(bbox_t[range(len(points)), min_area_inds])
        return torch.cat(labels), torch.cat(bbox_targets)

    def loss(self, cls_score, bbox_pred, centerness, gt_bboxes, gt_labels):
        n, _, h, w = cls_score.shape
        stride = self.strides[0]
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing='ij')
        points = torch.stack((xs.reshape(-1) * stride + stride // 2,
                              ys.reshape(-1) * stride + stride // 2), -1).float()
        labels, bbox_targets = self.get_targets(points, gt_bboxes, gt_labels)
        flat_cls = cls_score.permute(0, 2, 3, 1).reshape(-1, self.num_classes)
        flat_bbox = bbox_pred.permute(0, 2, 3, 1).reshape(-1, 4)
        flat_ctr = centerness.permute(0, 2, 3, 1).reshape(-1)
        pos_inds = ((labels >= 0) & (labels < self.num_classes)).nonzero().reshape(-1)
        num_pos = max(len(pos_inds), 1.0)
        cls_target = F.one_hot(labels, self.num_classes + 1)[:, :self.num_classes].float()
        loss_cls = sigmoid_focal_loss(flat_cls, cls_target, self.loss_cls_cfg['gamma'],
                                      self.loss_cls_cfg['alpha']).sum() / num_pos
        pos_bbox_pred = flat_bbox[pos_inds]
        pos_bbox_targets = bbox_targets[pos_inds]
        pos_ctr = flat_ctr[pos_inds]
        lr_ = pos_bbox_targets[:, [0, 2]]
        tb_ = pos_bbox_targets[:, [1, 3]]
        ctr_targets = torch.sqrt((lr_.min(-1).values / lr_.max(-1).values) *
                                 (tb_.min(-1).values / tb_.max(-1).values))
        loss_bbox = (iou_loss(pos_bbox_pred, pos_bbox_targets) * ctr_targets).sum() / ctr_targets.sum()
        loss_centerness = F.binary_cross_entropy_with_logits(pos_ctr, ctr_targets)
        return dict(loss_cls=loss_cls, loss_bbox=loss_bbox, loss_centerness=loss_centerness)


@register_module
class FCOS(nn.Module):
    def __init__(self, backbone, bbox_head):
        super().__init__()
        self.backbone = build(backbone)
        self.bbox_head = build(bbox_head)

    def forward_train(self, img, gt_bboxes, gt_labels):
        feat = self.backbone(img)
        outs = self.bbox_head(feat)
        return self.bbox_head.loss(*outs, gt_bboxes, gt_labels)

    def train_step(self, data_batch, optimizer):
        losses = self.forward_train(**data_batch)
        loss = sum(losses.values())
        log_vars = {k: v.item() for k, v in losses.items()}
        log_vars['loss'] = loss.item()
        return dict(loss=loss, log_vars=log_vars, num_samples=len(data_batch['img']))


# ----------------------------------------------------------------------------- runner / hooks
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
            grad_norm = self.clip_grads(runner.model.parameters())
            if grad_norm is not None:
                runner.outputs['log_vars']['grad_norm'] = float(grad_norm)
        runner.optimizer.step()


class EpochBasedRunner:
    def __init__(self, model, optimizer, cfg):
        self.model = model
        self.optimizer = optimizer
        self.cfg = cfg
        self.optimizer_hook = OptimizerHook(**cfg['optimizer_config'])
        self.base_lr = [g['lr'] for g in optimizer.param_groups]
        self.iter = 0
        self.outputs = None

    def _set_lr(self, epoch):
        lr_cfg = self.cfg['lr_config']
        factor = 0.1 ** sum(epoch >= s for s in lr_cfg['step'])
        if lr_cfg.get('warmup') == 'constant' and self.iter < lr_cfg['warmup_iters']:
            factor *= lr_cfg['warmup_ratio']
        for g, base in zip(self.optimizer.param_groups, self.base_lr):
            g['lr'] = base * factor

    def run(self, data_loader, max_epochs):
        interval = self.cfg['log_config']['interval']
        for epoch in range(max_epochs):
            self.model.train()
            for i, data_batch in enumerate(data_loader):
                self._set_lr(epoch)
                self.outputs = self.model.train_step(data_batch, self.optimizer)
                self.optimizer_hook.after_train_iter(self)
                self.iter += 1
                if (i + 1) % interval == 0:
                    lv = self.outputs['log_vars']
                    print(f"Epoch [{epoch + 1}][{i + 1}/{len(data_loader)}]\t"
                          f"lr: {self.optimizer.param_groups[0]['lr']:.3e}, "
                          + ', '.join(f'{k}: {v:.4f}' for k, v in lv.items()), flush=True)


def train_detector(cfg):
    random.seed(cfg['seed'])
    np.random.seed(cfg['seed'])
    torch.manual_seed(cfg['seed'])
    dataset = SyntheticVOCDataset(cfg['data']['num_images'], cfg['data']['img_size'],
                                  cfg['img_norm_cfg'], seed=cfg['seed'])
    data_loader = torch.utils.data.DataLoader(
        dataset, batch_size=cfg['data']['samples_per_gpu'], shuffle=True,
        num_workers=cfg['data']['workers_per_gpu'], collate_fn=collate,
        generator=torch.Generator().manual_seed(cfg['seed']))
    detector = build(cfg['model'])
    opt_cfg = dict(cfg['optimizer'])
    opt_type = opt_cfg.pop('type')
    optimizer = getattr(torch.optim, opt_type)(detector.parameters(), **opt_cfg)
    runner = EpochBasedRunner(detector, optimizer, cfg)
    runner.run(data_loader, cfg['total_epochs'])


if __name__ == '__main__':
    torch.set_num_threads(2)
    train_detector(cfg)
