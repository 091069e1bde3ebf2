"""Tiny single-level RetinaNet trained on a custom dataset with a maskrcnn-benchmark
style trainer (cfg node, WarmupMultiStepLR, MetricLogger, do_train).

Bug: do_train() goes straight from losses.backward() to optimizer.step() with no
gradient clipping.  The backbone has no normalisation layers and takes BGR 0..255
pixels with PIXEL_STD = 1 (the caffe convention), so after the warm-up an
unlucky batch gives a box-regression gradient far above the usual norm and the
momentum-SGD update throws the weights off; a few iterations later the losses are
inf / nan and stay nan.

Report: https://github.com/facebookresearch/maskrcnn-benchmark/issues/347
("training my own dataset sometimes occurs the NaN" in the first epochs; the
maintainer's answer: add torch.nn.utils.clip_grad_norm_ just before
optimizer.step() in engine/trainer.py).

Fix: clip the gradient norm between losses.backward() and optimizer.step(),
e.g. torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0).
"""
import datetime
import time
from bisect import bisect_right
from collections import defaultdict, deque
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

# ---------------------------------------------------------------- config
cfg = SimpleNamespace(
    INPUT=SimpleNamespace(PIXEL_MEAN=[102.98, 115.95, 122.77], PIXEL_STD=[1.0, 1.0, 1.0], SIZE=64),
    MODEL=SimpleNamespace(NUM_CLASSES=3, STRIDE=8, NUM_CONVS=4, CHANNELS=64,
                          FOCAL_ALPHA=0.25, FOCAL_GAMMA=2.0, BBOX_REG_WEIGHT=1.0),
    SOLVER=SimpleNamespace(BASE_LR=0.02, MOMENTUM=0.9, WEIGHT_DECAY=0.0001,
                           STEPS=(240,), GAMMA=0.1, WARMUP_FACTOR=1.0 / 3, WARMUP_ITERS=50,
                           MAX_ITER=300, IMS_PER_BATCH=8, CHECKPOINT_PERIOD=250),
    SEED=0,
)


# ---------------------------------------------------------------- data
class ToyParcelDataset(Dataset):
    """Own-dataset stand-in: coloured parcels (boxes) on a conveyor-belt background."""

    def __init__(self, num_images, size, num_classes, seed):
        rng = np.random.RandomState(seed)
        self.images, self.targets = [], []
        colours = np.array([[200, 60, 40], [40, 180, 220], [230, 220, 50]], dtype=np.float32)
        for _ in range(num_images):
            img = rng.normal(90, 25, size=(size, size, 3)).clip(0, 255).astype(np.float32)
            boxes, labels = [], []
            for _ in range(rng.randint(1, 4)):
                w, h = rng.randint(10, 40, size=2)
                x0, y0 = rng.randint(0, size - w), rng.randint(0, size - h)
                c = rng.randint(num_classes)
                img[y0:y0 + h, x0:x0 + w] = colours[c] + rng.normal(0, 10, 3)
                boxes.append([x0, y0, x0 + w, y0 + h])
                labels.append(c + 1)
            self.images.append(img)
            self.targets.append((np.array(boxes, np.float32), np.array(labels, np.int64)))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, idx):
        img = self.images[idx][:, :, ::-1].copy()  # RGB -> BGR255, as in to_bgr255
        img = (img - np.array(cfg.INPUT.PIXEL_MEAN)) / np.array(cfg.INPUT.PIXEL_STD)
        boxes, labels = self.targets[idx]
        return torch.from_numpy(img).permute(2, 0, 1).float(), torch.from_numpy(boxes), torch.from_numpy(labels), idx


def collate(batch):
    images, boxes, labels, idx = zip(*batch)
    return torch.stack(images), list(boxes), list(labels), idx


# ---------------------------------------------------------------- model
class TinyRetinaNet(nn.Module):
    def __init__(self, c):
        super().__init__()
        ch = c.MODEL.CHANNELS
        self.body = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, ch, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(ch, ch, 3, stride=2, padding=1), nn.ReLU(inplace=True),
        )
        cls_tower, bbox_tower = [], []
        for _ in range(c.MODEL.NUM_CONVS):
            cls_tower += [nn.Conv2d(ch, ch, 3, padding=1), nn.ReLU(inplace=True)]
            bbox_tower += [nn.Conv2d(ch, ch, 3, padding=1), nn.ReLU(inplace=True)]
        self.cls_tower = nn.Sequential(*cls_tower)
        self.bbox_tower = nn.Sequential(*bbox_tower)
        self.cls_logits = nn.Conv2d(ch, c.MODEL.NUM_CLASSES, 3, padding=1)
        self.bbox_pred = nn.Conv2d(ch, 4, 3, padding=1)
        for m in [self.cls_tower, self.bbox_tower, self.cls_logits, self.bbox_pred]:
            for l in m.modules():
                if isinstance(l, nn.Conv2d):
                    nn.init.normal_(l.weight, std=0.01)
                    nn.init.constant_(l.bias, 0)
        prior = 0.01
        nn.init.constant_(self.cls_logits.bias, -np.log((1 - prior) / prior))

    def forward(self, x):
        feat = self.body(x)
        return self.cls_logits(self.cls_tower(feat)), self.bbox_pred(self.bbox_tower(feat))


def prepare_targets(boxes_list, labels_list, fh, fw, stride, num_classes):
    ys, xs = torch.meshgrid(torch.arange(fh), torch.arange(fw), indexing="ij")
    cx = (xs.reshape(-1).float() + 0.5) * stride
    cy = (ys.reshape(-1).float() + 0.5) * stride
    cls_t, reg_t = [], []
    for boxes, labels in zip(boxes_list, labels_list):
        l = cx[:, None] - boxes[None, :, 0]
        t = cy[:, None] - boxes[None, :, 1]
        r = boxes[None, :, 2] - cx[:, None]
        b = boxes[None, :, 3] - cy[:, None]
        ltrb = torch.stack([l, t, r, b], dim=2)
        inside = ltrb.min(dim=2).values > 0
        area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))[None].repeat(len(cx), 1)
        area[~inside] = 1e8
        min_area, gt = area.min(dim=1)
        cls = torch.zeros(len(cx), num_classes)
        pos = min_area < 1e8
        cls[pos, labels[gt[pos]] - 1] = 1.0
        cls_t.append(cls)
        reg = ltrb[torch.arange(len(cx)), gt]  # box-edge distances in pixels
        reg[~pos] = 0
        reg_t.append(reg)
    return torch.stack(cls_t), torch.stack(reg_t)


def sigmoid_focal_loss(logits, targets, alpha, gamma):
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * ((1 - p_t) ** gamma)
    loss = (alpha * targets + (1 - alpha) * (1 - targets)) * loss
    return loss.sum()


def compute_losses(model, images, boxes, labels):
    cls_logits, bbox_pred = model(images)
    n, c, fh, fw = cls_logits.shape
    cls_t, reg_t = prepare_targets(boxes, labels, fh, fw, cfg.MODEL.STRIDE, c)
    cls_logits = cls_logits.permute(0, 2, 3, 1).reshape(n, -1, c)
    bbox_pred = bbox_pred.permute(0, 2, 3, 1).reshape(n, -1, 4)
    pos = cls_t.max(dim=2).values > 0
    num_pos = max(pos.sum().item(), 1)
    loss_cls = sigmoid_focal_loss(cls_logits, cls_t, cfg.MODEL.FOCAL_ALPHA, cfg.MODEL.FOCAL_GAMMA) / num_pos
    loss_reg = F.smooth_l1_loss(bbox_pred[pos], reg_t[pos], beta=1.0 / 9, reduction="sum") / num_pos
    return {"loss_retina_cls": loss_cls, "loss_retina_reg": cfg.MODEL.BBOX_REG_WEIGHT * loss_reg}


# ---------------------------------------------------------------- solver / logging
class WarmupMultiStepLR(torch.optim.lr_scheduler._LRScheduler):
    def __init__(self, optimizer, milestones, gamma, warmup_factor, warmup_iters, last_epoch=-1):
        self.milestones, self.gamma = list(milestones), gamma
        self.warmup_factor, self.warmup_iters = warmup_factor, warmup_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        warmup = 1
        if self.last_epoch < self.warmup_iters:
            alpha = float(self.last_epoch) / self.warmup_iters
            warmup = self.warmup_factor * (1 - alpha) + alpha
        return [b * warmup * self.gamma ** bisect_right(self.milestones, self.last_epoch) for b in self.base_lrs]


class SmoothedValue:
    def __init__(self, window_size=20):
        self.deque, self.total, self.count = deque(maxlen=window_size), 0.0, 0

    def update(self, v):
        self.deque.append(v)
        self.count += 1
        self.total += v

    @property
    def median(self):
        return float(np.median(list(self.deque)))

    @property
    def global_avg(self):
        return self.total / self.count


class MetricLogger:
    def __init__(self, delimiter="  "):
        self.meters, self.delimiter = defaultdict(SmoothedValue), delimiter

    def update(self, **kwargs):
        for k, v in kwargs.items():
            self.meters[k].update(float(v))

    def __str__(self):
        return self.delimiter.join("{}: {:.4f} ({:.4f})".format(k, m.median, m.global_avg) for k, m in self.meters.items())


def make_optimizer(model):
    params = []
    for key, value in model.named_parameters():
        lr, wd = cfg.SOLVER.BASE_LR, cfg.SOLVER.WEIGHT_DECAY
        if "bias" in key:
            lr, wd = cfg.SOLVER.BASE_LR * 2, 0.0
        params.append({"params": [value], "lr": lr, "weight_decay": wd})
    return torch.optim.SGD(params, lr=cfg.SOLVER.BASE_LR, momentum=cfg.SOLVER.MOMENTUM)


def do_train(model, data_loader, optimizer, scheduler, max_iter):
    meters = MetricLogger(delimiter="  ")
    model.train()
    start = time.time()
    iteration = 0
    while iteration < max_iter:
        for images, boxes, labels, _ in data_loader:
            iteration += 1
            loss_dict = compute_losses(model, images, boxes, labels)
            losses = sum(loss for loss in loss_dict.values())
            meters.update(loss=losses.item(), **{k: v.item() for k, v in loss_dict.items()})

            optimizer.zero_grad()
            losses.backward()
            optimizer.step()
            scheduler.step()

            if iteration % 10 == 0 or iteration == max_iter:
                eta = (time.time() - start) / iteration * (max_iter - iteration)
                print(meters.delimiter.join([
                    "eta: {}".format(str(datetime.timedelta(seconds=int(eta)))),
                    "iter: {}".format(iteration),
                    "{}".format(str(meters)),
                    "lr: {:.6f}".format(optimizer.param_groups[0]["lr"]),
                ]), flush=True)
            if iteration >= max_iter:
                break
    print("Total training time: {:.1f}s".format(time.time() - start))


def main():
    torch.manual_seed(cfg.SEED)
    np.random.seed(cfg.SEED)
    dataset = ToyParcelDataset(400, cfg.INPUT.SIZE, cfg.MODEL.NUM_CLASSES, seed=cfg.SEED)
    loader = DataLoader(dataset, batch_size=cfg.SOLVER.IMS_PER_BATCH, shuffle=True,
                        collate_fn=collate, drop_last=True,
                        generator=torch.Generator().manual_seed(cfg.SEED))
    model = TinyRetinaNet(cfg)
    optimizer = make_optimizer(model)
    scheduler = WarmupMultiStepLR(optimizer, cfg.SOLVER.STEPS, cfg.SOLVER.GAMMA,
                                  cfg.SOLVER.WARMUP_FACTOR, cfg.SOLVER.WARMUP_ITERS)
    do_train(model, loader, optimizer, scheduler, cfg.SOLVER.MAX_ITER)


if __name__ == "__main__":
    main()
