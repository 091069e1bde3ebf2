"""PP-YOLO (PaddleDetection YOLOv3 family) ported to PyTorch: from-scratch training without
``clip_grad_by_norm``.

Setting
-------
A PaddleDetection-style PP-YOLO trainer: the config below mirrors
``configs/ppyolo/_base_/ppyolo_r50vd_dcn.yml`` and ``optimizer_1x.yml`` (ResNet-vd backbone with
BN, PPYOLOFPN with CoordConv/SPP, YOLOv3Head with IoU-aware branch, YOLOv3Loss with
scale_x_y=1.05, IouLoss(2.5, squared), IouAwareLoss; Momentum 0.9, L2 5e-4, base_lr 0.01,
LinearWarmup(start_factor=0), PiecewiseDecay), shrunk to a 128x128 toy (schedule scaled:
20 warm-up steps instead of 4000).  Data is synthetic COCO-like: 1-6 objects per image, and
now and then (5 %) a crowded image with 100-180 small objects, as COCO has.

Bug
---
``OptimizerBuilder`` has no ``clip_grad_by_norm`` (None, as in ppyolo's optimizer_1x.yml before
the fix).  YOLOv3Loss sums the xy/wh/IoU/IoU-aware/cls terms over every positive cell of an
image (it is only averaged over images), so a batch holding a crowded image gives a loss of
~500-2200 and a global gradient norm of ~200-1600 instead of ~50 and ~8-60.  With plain
Momentum SGD at lr 0.01 each such spike throws the weights further (largest |w| climbs from
~11 to ~28 between iterations 17 and 34) until exp() of a w/h logit overflows in the YOLO box
decoding: at iteration 34 (warm-up ends at 20) loss_iou and loss_iou_aware are nan while the
weights are still finite; the nan gradients then poison every weight (the report: loss=nan in
about half of the from-scratch runs, with the native lr and batch size).

Fix
---
PaddleDetection added ``clip_grad_by_norm: 35.`` to ppyolo's OptimizerBuilder (global-norm
gradient clipping, lr left at 0.01); with it the same run trains (crowded batches still show a
larger loss, but no overflow).

Report: https://github.com/PaddlePaddle/PaddleDetection/issues/6998 (PP-YOLO loss=nan in ~50 % of
the runs; the maintainer, translated: "clip_grad_by_norm is the way to solve the nan; ppyolo
sometimes gives nan, ppyolov2 uses clip_grad_by_norm by default and ppyolo will add it by
default too"; the reporter confirmed no nan with ``clip_grad_by_norm: 35.``),
fixed by https://github.com/PaddlePaddle/PaddleDetection/pull/7352 ("add clip grad in ppyolo
config").
"""
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

cfg = {
    'architecture': 'YOLOv3',
    'num_classes': 4,
    'epoch': 1,
    'snapshot_epoch': 1,
    'TrainReader': {'batch_size': 8, 'image_shape': 128, 'max_boxes': 180, 'iters': 70},
    'YOLOv3Head': {
        'anchors': [[4, 5], [6, 10], [11, 8], [10, 20], [21, 15], [20, 40],
                    [39, 30], [52, 66], [90, 80]],
        'anchor_masks': [[6, 7, 8], [3, 4, 5], [0, 1, 2]],
        'iou_aware': True,
        'iou_aware_factor': 0.4,
    },
    'YOLOv3Loss': {'ignore_thresh': 0.7, 'downsample': [32, 16, 8], 'label_smooth': False,
                   'scale_x_y': 1.05},
    'IouLoss': {'loss_weight': 2.5, 'loss_square': True},
    'IouAwareLoss': {'loss_weight': 1.0},
    'LearningRate': {
        'base_lr': 0.01,
        'schedulers': [
            {'name': 'PiecewiseDecay', 'gamma': 0.1, 'milestones': [243, 324]},
            {'name': 'LinearWarmup', 'start_factor': 0., 'steps': 20},
        ],
    },
    'OptimizerBuilder': {
        'clip_grad_by_norm': None,
        'optimizer': {'momentum': 0.9, 'type': 'Momentum'},
        'regularizer': {'factor': 0.0005, 'type': 'L2'},
    },
}


# ------------------------------------------------------------------ modeling
class ConvBNLayer(nn.Module):
    def __init__(self, ch_in, ch_out, filter_size=3, stride=1, act='leaky'):
        super().__init__()
        self.conv = nn.Conv2d(ch_in, ch_out, filter_size, stride, filter_size // 2, bias=False)
        self.bn = nn.BatchNorm2d(ch_out)
        self.act = act

    def forward(self, x):
        x = self.bn(self.conv(x))
        if self.act == 'leaky':
            x = F.leaky_relu(x, 0.1)
        elif self.act == 'relu':
            x = F.relu(x)
        return x


class BasicBlock(nn.Module):
    """ResNet-vd basic block: the shortcut is avg-pool + 1x1 conv when downsampling."""

    def __init__(self, ch_in, ch_out, stride):
        super().__init__()
        self.branch2a = ConvBNLayer(ch_in, ch_out, 3, stride, act='relu')
        self.branch2b = ConvBNLayer(ch_out, ch_out, 3, 1, act=None)
        if stride != 1 or ch_in != ch_out:
            self.short = nn.Sequential(nn.AvgPool2d(stride, stride), ConvBNLayer(ch_in, ch_out, 1, act=None))
        else:
            self.short = nn.Identity()

    def forward(self, x):
        return F.relu(self.branch2b(self.branch2a(x)) + self.short(x))


class ResNet(nn.Module):
    def __init__(self, return_idx=(1, 2, 3)):
        super().__init__()
        self.stem = ConvBNLayer(3, 16, 3, 2, act='relu')
        chs = [16, 24, 32, 48, 64]
        self.res_layers = nn.ModuleList([BasicBlock(chs[i], chs[i + 1], 2) for i in range(4)])
        self.return_idx = return_idx

    def forward(self, x):
        x = self.stem(x)
        outs = []
        for i, layer in enumerate(self.res_layers):
            x = layer(x)
            if i in self.return_idx:
                outs.append(x)
        return outs  # strides 8, 16, 32


class CoordConv(nn.Module):
    def __init__(self, ch_in, ch_out, filter_size):
        super().__init__()
        self.conv = ConvBNLayer(ch_in + 2, ch_out, filter_size)

    def forward(self, x):
        b, _, h, w = x.shape
        gx = torch.linspace(-1, 1, w).view(1, 1, 1, w).expand(b, 1, h, w)
        gy = torch.linspace(-1, 1, h).view(1, 1, h, 1).expand(b, 1, h, w)
        return self.conv(torch.cat([x, gx, gy], 1))


class SPP(nn.Module):
    def __init__(self, ch_in, ch_out, pool_size=(5, 9, 13)):
        super().__init__()
        self.pool_size = pool_size
        self.conv = ConvBNLayer(ch_in * (len(pool_size) + 1), ch_out, 1)

    def forward(self, x):
        outs = [x] + [F.max_pool2d(x, k, 1, k // 2) for k in self.pool_size]
        return self.conv(torch.cat(outs, 1))


class PPYOLOFPN(nn.Module):
    def __init__(self, in_channels=(32, 48, 64), width=32, coord_conv=True, spp=True):
        super().__init__()
        self.yolo_blocks = nn.ModuleList()
        self.routes = nn.ModuleList()
        for i, ch in enumerate(reversed(in_channels)):
            ch_in = ch + (width // 2 if i > 0 else 0)
            layers = [CoordConv(ch_in, width, 1) if coord_conv else ConvBNLayer(ch_in, width, 1)]
            if spp and i == 0:
                layers.append(SPP(width, width))
            layers.append(ConvBNLayer(width, width, 3))
            self.yolo_blocks.append(nn.Sequential(*layers))
            self.routes.append(ConvBNLayer(width, width // 2, 1))
        self.out_channels = [width] * len(in_channels)

    def forward(self, blocks):
        yolo_feats = []
        route = None
        for i, block in enumerate(reversed(blocks)):
            if route is not None:
                block = torch.cat([route, block], 1)
            tip = self.yolo_blocks[i](block)
            yolo_feats.append(tip)
            route = F.interpolate(self.routes[i](tip), scale_factor=2.)
        return yolo_feats  # strides 32, 16, 8


class YOLOv3Head(nn.Module):
    def __init__(self, in_channels, anchors, anchor_masks, num_classes, iou_aware=True):
        super().__init__()
        self.num_classes = num_classes
        self.anchors = [[anchors[i] for i in mask] for mask in anchor_masks]
        self.iou_aware = iou_aware
        self.yolo_outputs = nn.ModuleList()
        for ch, mask in zip(in_channels, anchor_masks):
            num_out = len(mask) * (self.num_classes + 6) if iou_aware else len(mask) * (self.num_classes + 5)
            self.yolo_outputs.append(nn.Conv2d(ch, num_out, 1))

    def forward(self, feats):
        return [conv(f) for conv, f in zip(self.yolo_outputs, feats)]


class YOLOv3(nn.Module):
    def __init__(self, backbone, neck, yolo_head, loss):
        super().__init__()
        self.backbone, self.neck, self.yolo_head, self.loss = backbone, neck, yolo_head, loss

    def forward(self, inputs):
        yolo_outputs = self.yolo_head(self.neck(self.backbone(inputs['image'])))
        return self.loss(yolo_outputs, inputs, self.yolo_head.anchors)


# ------------------------------------------------------------------ losses
def make_grid(h, w, dtype):
    yv, xv = torch.meshgrid(torch.arange(h, dtype=dtype), torch.arange(w, dtype=dtype), indexing='ij')
    return torch.stack((xv, yv), 2)


def decode_yolo(box, anchor, downsample_ratio):
    x, y, w, h = box
    na, grid_h, grid_w = x.shape[1:4]
    grid = make_grid(grid_h, grid_w, x.dtype).reshape(1, 1, grid_h, grid_w, 2)
    x1 = (x + grid[..., 0:1]) / grid_w
    y1 = (y + grid[..., 1:2]) / grid_h
    anchor = torch.tensor(anchor, dtype=x.dtype).reshape(1, na, 1, 1, 2)
    w1 = torch.exp(w) * anchor[..., 0:1] / (downsample_ratio * grid_w)
    h1 = torch.exp(h) * anchor[..., 1:2] / (downsample_ratio * grid_h)
    return [x1, y1, w1, h1]


def xywh2xyxy(box):
    x, y, w, h = box
    return [x - w * 0.5, y - h * 0.5, x + w * 0.5, y + h * 0.5]


def bbox_transform(pbox, anchor, downsample):
    return xywh2xyxy(decode_yolo(pbox, anchor, downsample))


def bbox_iou(box1, box2, eps=1e-9):
    px1, py1, px2, py2 = box1
    gx1, gy1, gx2, gy2 = box2
    x1, y1 = torch.maximum(px1, gx1), torch.maximum(py1, gy1)
    x2, y2 = torch.minimum(px2, gx2), torch.minimum(py2, gy2)
    overlap = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    area1 = ((px2 - px1) * (py2 - py1)).clamp(min=0)
    area2 = ((gx2 - gx1) * (gy2 - gy1)).clamp(min=0)
    union = area1 + area2 - overlap + eps
    return overlap / union


def batch_iou_similarity(box1, box2, eps=1e-9):
    box1, box2 = box1.unsqueeze(2), box2.unsqueeze(1)
    x1y1 = torch.maximum(box1[..., 0:2], box2[..., 0:2])
    x2y2 = torch.minimum(box1[..., 2:4], box2[..., 2:4])
    overlap = (x2y2 - x1y1).clamp(min=0).prod(-1)
    area1 = (box1[..., 2:4] - box1[..., 0:2]).clamp(min=0).prod(-1)
    area2 = (box2[..., 2:4] - box2[..., 0:2]).clamp(min=0).prod(-1)
    return overlap / (area1 + area2 - overlap + eps)


class IouLoss(object):
    def __init__(self, loss_weight=2.5, loss_square=True):
        self.loss_weight, self.loss_square = loss_weight, loss_square

    def __call__(self, pbox, gbox):
        iou = bbox_iou(pbox, gbox)
        loss_iou = 1 - iou * iou if self.loss_square else 1 - iou
        return loss_iou * self.loss_weight


class IouAwareLoss(IouLoss):
    def __call__(self, ioup, pbox, gbox):
        with torch.no_grad():
            iou = bbox_iou(pbox, gbox)
        return F.binary_cross_entropy_with_logits(ioup, iou, reduction='none') * self.loss_weight


class YOLOv3Loss(nn.Module):
    def __init__(self, num_classes=80, ignore_thresh=0.7, label_smooth=False, downsample=(32, 16, 8),
                 scale_x_y=1., iou_loss=None, iou_aware_loss=None):
        super().__init__()
        self.num_classes = num_classes
        self.ignore_thresh = ignore_thresh
        self.label_smooth = label_smooth
        self.downsample = downsample
        self.scale_x_y = scale_x_y
        self.iou_loss = iou_loss
        self.iou_aware_loss = iou_aware_loss

    def obj_loss(self, pbox, gbox, pobj, tobj, anchor, downsample):
        pbox = torch.cat(bbox_transform(pbox, anchor, downsample), -1)
        b = pbox.shape[0]
        pbox = pbox.reshape(b, -1, 4)
        gxy = gbox[:, :, 0:2] - gbox[:, :, 2:4] * 0.5
        gwh = gbox[:, :, 0:2] + gbox[:, :, 2:4] * 0.5
        gbox = torch.cat([gxy, gwh], -1)
        with torch.no_grad():
            iou = batch_iou_similarity(pbox, gbox)
            iou_mask = (iou.max(2)[0] <= self.ignore_thresh).to(pbox.dtype)
        pobj = pobj.reshape(b, -1)
        tobj = tobj.reshape(b, -1)
        obj_mask = (tobj > 0).to(pbox.dtype)
        loss_obj = F.binary_cross_entropy_with_logits(pobj, obj_mask, reduction='none')
        return loss_obj * tobj + loss_obj * (1 - obj_mask) * iou_mask

    def yolov3_loss(self, p, t, gt_box, anchor, downsample, scale=1.):
        na = len(anchor)
        b, c, h, w = p.shape
        if self.iou_aware_loss:
            ioup, p = p[:, 0:na], p[:, na:]
            ioup = ioup.unsqueeze(-1)
        p = p.reshape(b, na, -1, h, w).permute(0, 1, 3, 4, 2)
        x, y = p[..., 0:1], p[..., 1:2]
        w, h = p[..., 2:3], p[..., 3:4]
        obj, pcls = p[..., 4:5], p[..., 5:]
        t = t.permute(0, 1, 3, 4, 2)
        tx, ty = t[..., 0:1], t[..., 1:2]
        tw, th = t[..., 2:3], t[..., 3:4]
        tscale = t[..., 4:5]
        tobj, tcls = t[..., 5:6], t[..., 6:]
        tscale_obj = tscale * tobj
        loss = dict()
        x = scale * torch.sigmoid(x) - 0.5 * (scale - 1.)
        y = scale * torch.sigmoid(y) - 0.5 * (scale - 1.)
        loss_xy = tscale_obj * ((x - tx).abs() + (y - ty).abs())
        loss['loss_xy'] = loss_xy.sum([1, 2, 3, 4]).mean()
        loss_wh = tscale_obj * ((w - tw).abs() + (h - th).abs())
        loss['loss_wh'] = loss_wh.sum([1, 2, 3, 4]).mean()
        box, tbox = [x, y, w, h], [tx, ty, tw, th]
        pbox = bbox_transform(box, anchor, downsample)
        gbox = bbox_transform(tbox, anchor, downsample)
        loss['loss_iou'] = (self.iou_loss(pbox, gbox) * tscale_obj).sum([1, 2, 3, 4]).mean()
        loss['loss_iou_aware'] = (self.iou_aware_loss(ioup, pbox, gbox) * tobj).sum([1, 2, 3, 4]).mean()
        loss['loss_obj'] = self.obj_loss(box, gt_box, obj, tobj, anchor, downsample).sum(-1).mean()
        loss_cls = F.binary_cross_entropy_with_logits(pcls, tcls, reduction='none') * tobj
        loss['loss_cls'] = loss_cls.sum([1, 2, 3, 4]).mean()
        return loss

    def forward(self, inputs, targets, anchors):
        gt_targets = [targets['target{}'.format(i)] for i in range(len(inputs))]
        gt_box = targets['gt_bbox']
        yolo_losses = dict()
        for x, t, anchor, downsample in zip(inputs, gt_targets, anchors, self.downsample):
            for k, v in self.yolov3_loss(x, t, gt_box, anchor, downsample, self.scale_x_y).items():
                yolo_losses[k] = yolo_losses.get(k, 0.) + v
        yolo_losses['loss'] = sum(yolo_losses.values())
        return yolo_losses


# ------------------------------------------------------------------ data
class Gt2YoloTarget(object):
    def __init__(self, anchors, anchor_masks, downsample_ratios, num_classes):
        self.anchors, self.anchor_masks = anchors, anchor_masks
        self.downsample_ratios, self.num_classes = downsample_ratios, num_classes

    def __call__(self, sample):
        h, w = sample['image'].shape[1:3]
        an_hw = np.array(self.anchors, dtype=np.float32) / np.array([[w, h]], dtype=np.float32)
        gt_bbox, gt_class = sample['gt_bbox'], sample['gt_class']
        for i, (mask, ds) in enumerate(zip(self.anchor_masks, self.downsample_ratios)):
            grid_h, grid_w = h // ds, w // ds
            target = np.zeros((len(mask), 6 + self.num_classes, grid_h, grid_w), dtype=np.float32)
            for b in range(gt_bbox.shape[0]):
                gx, gy, gw, gh = gt_bbox[b]
                if gw <= 0. or gh <= 0.:
                    continue
                inter = np.minimum(gw, an_hw[:, 0]) * np.minimum(gh, an_hw[:, 1])
                iou = inter / (gw * gh + an_hw[:, 0] * an_hw[:, 1] - inter)
                best_idx = int(np.argmax(iou))
                if best_idx in mask:
                    idx = mask.index(best_idx)
                    gi, gj = int(gx * grid_w), int(gy * grid_h)
                    target[idx, 0, gj, gi] = gx * grid_w - gi
                    target[idx, 1, gj, gi] = gy * grid_h - gj
                    target[idx, 2, gj, gi] = np.log(gw * w / self.anchors[best_idx][0])
                    target[idx, 3, gj, gi] = np.log(gh * h / self.anchors[best_idx][1])
                    target[idx, 4, gj, gi] = 2.0 - gw * gh
                    target[idx, 5, gj, gi] = 1.
                    target[idx, 6 + gt_class[b], gj, gi] = 1.
            sample['target{}'.format(i)] = target
        return sample


class SyntheticCOCODataSet(object):
    """COCO-like scenes: a few objects per image, and now and then a crowd of small ones."""

    def __init__(self, image_shape, max_boxes, num_classes, crowd_prob=0.05, seed=0):
        self.size, self.max_boxes, self.num_classes = image_shape, max_boxes, num_classes
        self.crowd_prob = crowd_prob
        self.rng = np.random.RandomState(seed)
        self.mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1)
        self.std = np.array([0.229, 0.224, 0.225], np.float32).reshape(3, 1, 1)

    def sample(self):
        rng, size = self.rng, self.size
        img = rng.rand(3, size, size).astype(np.float32) * 0.2
        crowd = rng.rand() < self.crowd_prob
        num = rng.randint(100, 181) if crowd else rng.randint(1, 7)
        gt_bbox = np.zeros((self.max_boxes, 4), np.float32)
        gt_class = rng.randint(0, self.num_classes, size=self.max_boxes)
        for j in range(num):
            bw, bh = rng.uniform(0.03, 0.1, 2) if crowd else rng.uniform(0.06, 0.9, 2)
            cx, cy = rng.uniform(bw / 2, 1 - bw / 2), rng.uniform(bh / 2, 1 - bh / 2)
            gt_bbox[j] = [cx, cy, bw, bh]
            x0, y0 = int((cx - bw / 2) * size), int((cy - bh / 2) * size)
            x1, y1 = int((cx + bw / 2) * size), int((cy + bh / 2) * size)
            img[gt_class[j] % 3, y0:y1, x0:x1] += 0.8
        img = (img - self.mean) / self.std  # NormalizeImage
        return {'image': img, 'gt_bbox': gt_bbox, 'gt_class': gt_class}


class TrainReader(object):
    def __init__(self, dataset, transform, batch_size, iters):
        self.dataset, self.transform = dataset, transform
        self.batch_size, self.iters = batch_size, iters

    def __len__(self):
        return self.iters

    def __iter__(self):
        for _ in range(self.iters):
            samples = [self.transform(self.dataset.sample()) for _ in range(self.batch_size)]
            yield {k: torch.from_numpy(np.stack([s[k] for s in samples])) for k in samples[0]
                   if k != 'gt_class'}


# ------------------------------------------------------------------ optimizer
class LearningRate(object):
    def __init__(self, base_lr, schedulers):
        self.base_lr = base_lr
        self.decay = [s for s in schedulers if s['name'] == 'PiecewiseDecay'][0]
        self.warmup = [s for s in schedulers if s['name'] == 'LinearWarmup'][0]

    def __call__(self, step, epoch):
        lr = self.base_lr * self.decay['gamma'] ** sum(epoch >= m for m in self.decay['milestones'])
        if step < self.warmup['steps']:
            alpha = step / self.warmup['steps']
            lr = lr * (self.warmup['start_factor'] * (1 - alpha) + alpha)
        return lr


class OptimizerBuilder(object):
    def __init__(self, clip_grad_by_norm=None, clip_grad_by_value=None,
                 regularizer={'type': 'L2', 'factor': .0001},
                 optimizer={'type': 'Momentum', 'momentum': .9}):
        self.clip_grad_by_norm = clip_grad_by_norm
        self.clip_grad_by_value = clip_grad_by_value
        self.regularizer = regularizer
        self.optimizer = optimizer

    def __call__(self, learning_rate, model):
        assert self.optimizer['type'] == 'Momentum'
        return torch.optim.SGD(model.parameters(), lr=learning_rate,
                               momentum=self.optimizer['momentum'],
                               weight_decay=self.regularizer['factor'])

    def clip(self, model):
        if self.clip_grad_by_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.clip_grad_by_norm)
        elif self.clip_grad_by_value is not None:
            torch.nn.utils.clip_grad_value_(model.parameters(), abs(self.clip_grad_by_value))


# ------------------------------------------------------------------ trainer
class Trainer(object):
    def __init__(self, cfg):
        self.cfg = cfg
        nc = cfg['num_classes']
        head_cfg, loss_cfg = cfg['YOLOv3Head'], cfg['YOLOv3Loss']
        backbone = ResNet()
        neck = PPYOLOFPN()
        head = YOLOv3Head(neck.out_channels, head_cfg['anchors'], head_cfg['anchor_masks'], nc,
                          head_cfg['iou_aware'])
        loss = YOLOv3Loss(nc, loss_cfg['ignore_thresh'], loss_cfg['label_smooth'], loss_cfg['downsample'],
                          loss_cfg['scale_x_y'], IouLoss(**cfg['IouLoss']), IouAwareLoss(**cfg['IouAwareLoss']))
        self.model = YOLOv3(backbone, neck, head, loss)
        reader_cfg = cfg['TrainReader']
        dataset = SyntheticCOCODataSet(reader_cfg['image_shape'], reader_cfg['max_boxes'], nc)
        transform = Gt2YoloTarget(head_cfg['anchors'], head_cfg['anchor_masks'], loss_cfg['downsample'], nc)
        self.loader = TrainReader(dataset, transform, reader_cfg['batch_size'], reader_cfg['iters'])
        self.lr = LearningRate(**cfg['LearningRate'])
        self.optimizer_builder = OptimizerBuilder(**cfg['OptimizerBuilder'])
        self.optimizer = self.optimizer_builder(self.lr(0, 0), self.model)

    def train(self):
        self.model.train()
        steps_per_epoch = len(self.loader)
        for epoch_id in range(self.cfg['epoch']):
            iter_tic = time.time()
            for step_id, data in enumerate(self.loader):
                global_step = epoch_id * steps_per_epoch + step_id
                curr_lr = self.lr(global_step, epoch_id)
                for group in self.optimizer.param_groups:
                    group['lr'] = curr_lr
                outputs = self.model(data)
                loss = outputs['loss']
                loss.backward()
                self.optimizer_builder.clip(self.model)
                self.optimizer.step()
                self.optimizer.zero_grad()
                if step_id % 5 == 0 or not torch.isfinite(loss):
                    stats = ' '.join('{}: {:.6f}'.format(k, v.item()) for k, v in outputs.items())
                    print('Epoch: [{}] [{:>4}/{}] learning_rate: {:.6f} {} batch_cost: {:.4f} sec'.format(
                        epoch_id, step_id, steps_per_epoch, curr_lr, stats, time.time() - iter_tic))
                iter_tic = time.time()


def main():
    torch.manual_seed(0)
    trainer = Trainer(cfg)
    trainer.train()


if __name__ == '__main__':
    main()
