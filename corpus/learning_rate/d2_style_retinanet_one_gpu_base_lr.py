"""RetinaNet trained detectron2-style on one GPU's worth of images with the 16-image lr.

A compact re-implementation of detectron2's RetinaNet training path: a config tree
(``Base-RetinaNet.yaml`` values), a ResNet-style backbone with frozen BatchNorm fed with
BGR pixels minus ``PIXEL_MEAN`` and ``PIXEL_STD = [1, 1, 1]`` (the MSRA-weights convention),
FPN P3-P5, the shared RetinaNet heads with prior-probability bias init, IoU matching
(0.4 / 0.5), sigmoid focal loss + smooth-L1 (beta 0.1) normalised by the number of
foreground anchors, SGD with the ``WarmupMultiStepLR`` schedule (linear warm-up from 1/1000
over 1000 iterations), a ``SimpleTrainer``-like ``run_step`` that raises
``FloatingPointError("Loss became infinite or NaN ...")`` and a metric printer every 20
iterations.

The run mirrors facebookresearch/detectron2#214 ("FloatingPointError: Loss became infinite
or NaN at iteration=***!", https://github.com/facebookresearch/detectron2/issues/214): a
RetinaNet run on a single GPU that kept the config file's ``BASE_LR = 0.01``, the value meant
for 16 images over 8 GPUs (the reported log: loss_cls ~1.18, loss_box_reg ~0.47 at iterations
379-519 while the warm-up ramps the lr to 0.0052, then loss_cls nan).  Here, with 2 images per
batch, the losses drift down while the warm-up keeps the rate small (total_loss median 1.66
-> 1.58 by iteration 319); once the ramped-up rate passes what a 2-image batch tolerates
(lr ~0.0033) the losses spike (loss_cls 7.4 at iteration 324, 44 at 328, loss_box_reg 750 at
331, 7.7e14 at 332) and the trainer stops with FloatingPointError at iteration 333 (loss_cls
nan, loss_box_reg nan).  The maintainer pointed to the single-GPU instructions
(GETTING_STARTED: ``SOLVER.IMS_PER_BATCH 2 SOLVER.BASE_LR 0.0025``, the linear scaling rule)
and the reporter confirmed ("official configuration for one GPU is batchsize 2, base_lr
0.0025").

Fix: scale the learning rate with the batch, ``cfg.SOLVER.BASE_LR = 0.01 * 2 / 16``.
"""
import datetime
import math
import time
from collections import defaultdict, deque

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class CfgNode(dict):
    def __getattr__(self, name):
        return self[name]

    def __setattr__(self, name, value):
        self[name] = value


def get_cfg():
    _C = CfgNode()
    _C.MODEL = CfgNode(PIXEL_MEAN=[103.530, 116.280, 123.675], PIXEL_STD=[1.0, 1.0, 1.0])
    _C.MODEL.RETINANET = CfgNode(NUM_CLASSES=3, NUM_CONVS=2, IOU_THRESHOLDS=[0.4, 0.5],
                                 PRIOR_PROB=0.01, FOCAL_LOSS_GAMMA=2.0, FOCAL_LOSS_ALPHA=0.25,
                                 SMOOTH_L1_LOSS_BETA=0.1)
    _C.MODEL.ANCHOR_GENERATOR = CfgNode(SIZES=[[16], [32], [64]], ASPECT_RATIOS=[0.5, 1.0, 2.0])
    _C.MODEL.FPN = CfgNode(OUT_CHANNELS=32)
    _C.SOLVER = CfgNode(IMS_PER_BATCH=16, BASE_LR=0.01, MOMENTUM=0.9, WEIGHT_DECAY=1e-4,
                        STEPS=(60000, 80000), MAX_ITER=90000, GAMMA=0.1,
                        WARMUP_FACTOR=1.0 / 1000, WARMUP_ITERS=1000)
    _C.SEED = 7
    return _C


# ------------------------------------------------------------------------------- data
def build_shapes_dataset(n, size=96, seed=0):
    """Synthetic detection set: 1-3 filled rectangles / ellipses / triangles per image,
    stored as HWC BGR float images in 0..255 and XYXY boxes in pixels."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size]
    colours = np.array([[40, 40, 210], [40, 200, 40], [210, 60, 40]], dtype=np.float32)
    dataset = []
    for _ in range(n):
        img = rng.normal(120.0, 18.0, size=(size, size, 3)).astype(np.float32)
        boxes, classes = [], []
        for _ in range(int(rng.integers(1, 4))):
            cls = int(rng.integers(0, 3))
            w, h = (int(v) for v in rng.integers(12, 48, size=2))
            x0, y0 = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
            if cls == 0:
                m = (xx >= x0) & (xx < x0 + w) & (yy >= y0) & (yy < y0 + h)
            elif cls == 1:
                m = ((xx - x0 - w / 2) / (w / 2)) ** 2 + ((yy - y0 - h / 2) / (h / 2)) ** 2 <= 1
            else:
                m = (yy >= y0) & (yy < y0 + h) & (np.abs(xx - x0 - w / 2) <= (yy - y0) * w / (2 * h))
            img[m] = colours[cls] + rng.normal(0, 12, size=3)
            boxes.append([x0, y0, x0 + w, y0 + h])
            classes.append(cls)
        dataset.append({"image": torch.from_numpy(img.transpose(2, 0, 1).copy()),
                        "gt_boxes": torch.tensor(boxes, dtype=torch.float32),
                        "gt_classes": torch.tensor(classes)})
    return dataset


def build_train_loader(dataset, batch_size, seed):
    g = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(dataset), generator=g).tolist()
        for i in range(0, len(order) - batch_size + 1, batch_size):
            yield [dataset[j] for j in order[i:i + batch_size]]


# ------------------------------------------------------------------------------- model
class FrozenBatchNorm2d(nn.Module):
    """BatchNorm2d where the batch statistics and the affine parameters are fixed.
    Without the ImageNet checkpoint the statistics are set once from the first batch
    (``calibrate``), standing in for the pretrained running_mean / running_var."""

    def __init__(self, num_features, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features) - eps)
        self.calibrating = False

    def forward(self, x):
        if self.calibrating:
            self.running_mean.copy_(x.mean(dim=(0, 2, 3)))
            self.running_var.copy_(x.var(dim=(0, 2, 3)))
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        bias = self.bias - self.running_mean * scale
        return x * scale.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)


@torch.no_grad()
def calibrate_frozen_bn(model, batch):
    layers = [m for m in model.modules() if isinstance(m, FrozenBatchNorm2d)]
    for m in layers:
        m.calibrating = True
    model.train()
    model(batch)
    for m in layers:
        m.calibrating = False


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = FrozenBatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = FrozenBatchNorm2d(cout)
        self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), FrozenBatchNorm2d(cout))
        for conv in (self.conv1, self.conv2, self.shortcut[0]):
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        out = F.relu_(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu_(out + self.shortcut(x))


class ResNetFPN(nn.Module):
    def __init__(self, out_channels):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), FrozenBatchNorm2d(16),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))      # /4
        self.res3 = BasicBlock(16, 32, 2)    # /8
        self.res4 = BasicBlock(32, 64, 2)    # /16
        self.res5 = BasicBlock(64, 96, 2)    # /32
        self.lateral = nn.ModuleList([nn.Conv2d(c, out_channels, 1) for c in (32, 64, 96)])
        self.output = nn.ModuleList([nn.Conv2d(out_channels, out_channels, 3, 1, 1) for _ in range(3)])
        for m in list(self.lateral) + list(self.output):
            nn.init.kaiming_uniform_(m.weight, a=1)     # c2_xavier_fill
            nn.init.zeros_(m.bias)

    def forward(self, x):
        c3 = self.res3(self.stem(x))
        c4 = self.res4(c3)
        c5 = self.res5(c4)
        feats, prev = [], None
        for i, c in reversed(list(enumerate((c3, c4, c5)))):
            lat = self.lateral[i](c)
            prev = lat if prev is None else lat + F.interpolate(prev, size=lat.shape[-2:], mode="nearest")
            feats.insert(0, self.output[i](prev))
        return feats                                     # P3, P4, P5


class RetinaNetHead(nn.Module):
    def __init__(self, cfg, in_channels, num_anchors):
        super().__init__()
        num_classes = cfg.MODEL.RETINANET.NUM_CLASSES
        cls_subnet, bbox_subnet = [], []
        for _ in range(cfg.MODEL.RETINANET.NUM_CONVS):
            cls_subnet += [nn.Conv2d(in_channels, in_channels, 3, 1, 1), nn.ReLU()]
            bbox_subnet += [nn.Conv2d(in_channels, in_channels, 3, 1, 1), nn.ReLU()]
        self.cls_subnet = nn.Sequential(*cls_subnet)
        self.bbox_subnet = nn.Sequential(*bbox_subnet)
        self.cls_score = nn.Conv2d(in_channels, num_anchors * num_classes, 3, 1, 1)
        self.bbox_pred = nn.Conv2d(in_channels, num_anchors * 4, 3, 1, 1)
        for layer in self.modules():
            if isinstance(layer, nn.Conv2d):
                nn.init.normal_(layer.weight, mean=0, std=0.01)
                nn.init.constant_(layer.bias, 0)
        prior_prob = cfg.MODEL.RETINANET.PRIOR_PROB
        nn.init.constant_(self.cls_score.bias, -math.log((1 - prior_prob) / prior_prob))

    def forward(self, features):
        logits = [self.cls_score(self.cls_subnet(f)) for f in features]
        deltas = [self.bbox_pred(self.bbox_subnet(f)) for f in features]
        return logits, deltas


def generate_anchors(cfg, feature_shapes, strides):
    anchors = []
    for (h, w), stride, sizes in zip(feature_shapes, strides, cfg.MODEL.ANCHOR_GENERATOR.SIZES):
        cell = []
        for size in sizes:
            for ar in cfg.MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS:
                aw, ah = size / math.sqrt(ar), size * math.sqrt(ar)
                cell.append([-aw / 2, -ah / 2, aw / 2, ah / 2])
        cell = torch.tensor(cell)
        ys, xs = torch.meshgrid(torch.arange(h) * stride + stride / 2,
                                torch.arange(w) * stride + stride / 2, indexing="ij")
        shifts = torch.stack([xs, ys, xs, ys], dim=-1).reshape(-1, 1, 4)
        anchors.append((shifts + cell[None]).reshape(-1, 4))
    return torch.cat(anchors)


def pairwise_iou(a, b):
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[:, 2:] - a[:, :2]).prod(-1)
    area_b = (b[:, 2:] - b[:, :2]).prod(-1)
    return inter / (area_a[:, None] + area_b[None] - inter)


def get_deltas(src, target):
    sw, sh = src[:, 2] - src[:, 0], src[:, 3] - src[:, 1]
    sx, sy = src[:, 0] + 0.5 * sw, src[:, 1] + 0.5 * sh
    tw, th = target[:, 2] - target[:, 0], target[:, 3] - target[:, 1]
    tx, ty = target[:, 0] + 0.5 * tw, target[:, 1] + 0.5 * th
    return torch.stack([(tx - sx) / sw, (ty - sy) / sh, torch.log(tw / sw), torch.log(th / sh)], dim=1)


def sigmoid_focal_loss(inputs, targets, alpha, gamma):
    p = torch.sigmoid(inputs)
    ce_loss = F.binary_cross_entropy_with_logits(inputs, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce_loss * ((1 - p_t) ** gamma)
    alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
    return (alpha_t * loss).sum()


class RetinaNet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.backbone = ResNetFPN(cfg.MODEL.FPN.OUT_CHANNELS)
        num_anchors = len(cfg.MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS)
        self.head = RetinaNetHead(cfg, cfg.MODEL.FPN.OUT_CHANNELS, num_anchors)
        self.register_buffer("pixel_mean", torch.tensor(cfg.MODEL.PIXEL_MEAN).view(-1, 1, 1))
        self.register_buffer("pixel_std", torch.tensor(cfg.MODEL.PIXEL_STD).view(-1, 1, 1))
        self.num_classes = cfg.MODEL.RETINANET.NUM_CLASSES

    def forward(self, batched_inputs):
        images = torch.stack([(x["image"] - self.pixel_mean) / self.pixel_std for x in batched_inputs])
        features = self.backbone(images)
        logits, deltas = self.head(features)
        n = images.shape[0]
        logits = torch.cat([l.permute(0, 2, 3, 1).reshape(n, -1, self.num_classes) for l in logits], 1)
        deltas = torch.cat([d.permute(0, 2, 3, 1).reshape(n, -1, 4) for d in deltas], 1)
        anchors = generate_anchors(self.cfg, [f.shape[-2:] for f in features], (8, 16, 32))
        return self.losses(anchors, logits, deltas, batched_inputs)

    def losses(self, anchors, pred_logits, pred_deltas, batched_inputs):
        lo, hi = self.cfg.MODEL.RETINANET.IOU_THRESHOLDS
        gt_labels, gt_deltas = [], []
        for x in batched_inputs:
            iou = pairwise_iou(x["gt_boxes"], anchors)              # G x A
            matched_vals, matches = iou.max(dim=0)
            labels = x["gt_classes"][matches].clone()
            labels[matched_vals < hi] = -1                          # ignore
            labels[matched_vals < lo] = self.num_classes            # background
            best = iou.argmax(dim=1)                                # allow_low_quality_matches
            labels[best] = x["gt_classes"]
            matches[best] = torch.arange(len(best))
            gt_labels.append(labels)
            gt_deltas.append(get_deltas(anchors, x["gt_boxes"][matches]))
        gt_labels, gt_deltas = torch.stack(gt_labels), torch.stack(gt_deltas)
        valid = gt_labels >= 0
        pos = valid & (gt_labels != self.num_classes)
        normalizer = max(1, pos.sum().item())
        targets = F.one_hot(gt_labels[valid], self.num_classes + 1)[:, :-1].float()
        r = self.cfg.MODEL.RETINANET
        loss_cls = sigmoid_focal_loss(pred_logits[valid], targets, r.FOCAL_LOSS_ALPHA, r.FOCAL_LOSS_GAMMA)
        loss_box_reg = F.smooth_l1_loss(pred_deltas[pos], gt_deltas[pos], beta=r.SMOOTH_L1_LOSS_BETA,
                                        reduction="sum")
        return {"loss_cls": loss_cls / normalizer, "loss_box_reg": loss_box_reg / normalizer}


# ------------------------------------------------------------------------------- solver
class WarmupMultiStepLR(torch.optim.lr_scheduler.LambdaLR):
    def __init__(self, optimizer, milestones, gamma, warmup_factor, warmup_iters):
        def lr_lambda(it):
            factor = 1.0
            if it < warmup_iters:
                alpha = it / warmup_iters
                factor = warmup_factor * (1 - alpha) + alpha
            return factor * gamma ** sum(it >= m for m in milestones)
        super().__init__(optimizer, lr_lambda)


class SimpleTrainer:
    def __init__(self, model, data_loader, optimizer, scheduler):
        self.model, self.data_loader = model, data_loader
        self.optimizer, self.scheduler = optimizer, scheduler
        self.history = defaultdict(lambda: deque(maxlen=20))
        self.iter = 0

    def _detect_anomaly(self, losses, loss_dict):
        if not torch.isfinite(losses).all():
            raise FloatingPointError(
                "Loss became infinite or NaN at iteration={}!\nloss_dict = {}".format(self.iter, loss_dict))

    def run_step(self):
        start = time.perf_counter()
        data = next(self.data_loader)
        loss_dict = self.model(data)
        losses = sum(loss_dict.values())
        self._detect_anomaly(losses, loss_dict)
        self.optimizer.zero_grad()
        losses.backward()
        self.optimizer.step()
        self.scheduler.step()
        for k, v in loss_dict.items():
            self.history[k].append(v.item())
        self.history["total_loss"].append(losses.item())
        self.history["time"].append(time.perf_counter() - start)

    def write_metrics(self, max_iter):
        med = {k: float(np.median(v)) for k, v in self.history.items()}
        eta = datetime.timedelta(seconds=int(med["time"] * (max_iter - self.iter - 1)))
        lr = self.optimizer.param_groups[0]["lr"]
        print(" eta: {}  iter: {}  total_loss: {:.4g}  loss_cls: {:.4g}  loss_box_reg: {:.4g}  "
              "time: {:.4f}  lr: {:.6g}".format(eta, self.iter, med["total_loss"], med["loss_cls"],
                                                med["loss_box_reg"], med["time"], lr), flush=True)

    def train(self, max_iter):
        print("Starting training from iteration 0")
        for self.iter in range(max_iter):
            self.run_step()
            if (self.iter + 1) % 20 == 0 or self.iter == max_iter - 1:
                self.write_metrics(max_iter)


def main():
    cfg = get_cfg()
    # single-GPU run: batch cut to 2 images, solver otherwise taken from Base-RetinaNet.yaml
    cfg.SOLVER.IMS_PER_BATCH = 2
    cfg.SOLVER.BASE_LR = 0.01
    cfg.SOLVER.MAX_ITER = 700

    torch.manual_seed(cfg.SEED)
    torch.set_num_threads(1)
    model = RetinaNet(cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=cfg.SOLVER.BASE_LR, momentum=cfg.SOLVER.MOMENTUM,
                                weight_decay=cfg.SOLVER.WEIGHT_DECAY)
    scheduler = WarmupMultiStepLR(optimizer, cfg.SOLVER.STEPS, cfg.SOLVER.GAMMA,
                                  cfg.SOLVER.WARMUP_FACTOR, cfg.SOLVER.WARMUP_ITERS)
    dataset = build_shapes_dataset(400, seed=cfg.SEED)
    calibrate_frozen_bn(model, dataset[:16])
    loader = build_train_loader(dataset, cfg.SOLVER.IMS_PER_BATCH, cfg.SEED)
    SimpleTrainer(model, loader, optimizer, scheduler).train(cfg.SOLVER.MAX_ITER)


if __name__ == "__main__":
    main()
