"""Single-GPU run of a maskrcnn-benchmark style box head on synthetic scenes.

A small VGG-like backbone (Caffe2-style input: BGR 0..255 minus PIXEL_MEAN, no std
division) feeds a box head that classifies the object in the image and regresses
its box (BoxCoder-style deltas w.r.t. the full-image anchor, weights 10/10/5/5).
Training follows the maskrcnn-benchmark recipe: SGD with momentum, weight decay,
BIAS_LR_FACTOR 2 and a WarmupMultiStepLR schedule; logs every 20 iterations.
"""
from collections import defaultdict, deque

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

cfg = {
    "INPUT": {"SIZE": 48, "PIXEL_MEAN": [102.9801, 115.9465, 122.7717]},
    "MODEL": {"NUM_CLASSES": 4, "BBOX_REG_WEIGHTS": (10.0, 10.0, 5.0, 5.0)},
    "SOLVER": {
        "BASE_LR": 0.02,
        "MOMENTUM": 0.9,
        "WEIGHT_DECAY": 0.0001,
        "BIAS_LR_FACTOR": 2,
        "WEIGHT_DECAY_BIAS": 0,
        "STEPS": (200, 260),
        "GAMMA": 0.1,
        "WARMUP_FACTOR": 1.0 / 3,
        "WARMUP_ITERS": 100,
        "MAX_ITER": 300,
        "IMS_PER_BATCH": 2,
    },
}

COLORS = {1: (40, 40, 230), 2: (40, 220, 40), 3: (230, 60, 40)}  # BGR


class SyntheticScenes(Dataset):
    """Noisy background with one coloured rectangle; target = (label, box xyxy)."""

    def __init__(self, n, size, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.images, self.labels, self.boxes = [], [], []
        for _ in range(n):
            img = torch.rand(3, size, size, generator=g) * 80 + 60
            label = int(torch.randint(1, 4, (1,), generator=g))
            w, h = torch.randint(8, size // 2, (2,), generator=g).tolist()
            x1 = int(torch.randint(0, size - w, (1,), generator=g))
            y1 = int(torch.randint(0, size - h, (1,), generator=g))
            for c, v in enumerate(COLORS[label]):
                img[c, y1:y1 + h, x1:x1 + w] = v
            self.images.append(img)
            self.labels.append(label)
            self.boxes.append(torch.tensor([x1, y1, x1 + w, y1 + h], dtype=torch.float32))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.labels[i], self.boxes[i]


def to_image_list(images):
    mean = torch.tensor(cfg["INPUT"]["PIXEL_MEAN"]).view(1, 3, 1, 1)
    return images - mean


def encode(boxes, size, weights):
    wx, wy, ww, wh = weights
    aw = ah = float(size)
    acx = acy = size / 2.0
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    cx = boxes[:, 0] + 0.5 * w
    cy = boxes[:, 1] + 0.5 * h
    return torch.stack([wx * (cx - acx) / aw, wy * (cy - acy) / ah,
                        ww * torch.log(w / aw), wh * torch.log(h / ah)], dim=1)


def smooth_l1_loss(input, target, beta=1.0 / 9):
    n = torch.abs(input - target)
    loss = torch.where(n < beta, 0.5 * n ** 2 / beta, n - 0.5 * beta)
    return loss.sum()


class VGGBackbone(nn.Module):
    def __init__(self):
        super().__init__()
        layers, in_c = [], 3
        for i, out_c in enumerate((64, 64, 128, 128, 256)):
            layers += [nn.Conv2d(in_c, out_c, 3, padding=1), nn.ReLU(inplace=True)]
            if i > 0:
                layers.append(nn.MaxPool2d(2))
            in_c = out_c
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        return self.body(x)


class BoxHead(nn.Module):
    def __init__(self, in_channels, num_classes, rep_size=256):
        super().__init__()
        self.fc6 = nn.Linear(in_channels * 9, rep_size)
        self.fc7 = nn.Linear(rep_size, rep_size)
        self.cls_score = nn.Linear(rep_size, num_classes)
        self.bbox_pred = nn.Linear(rep_size, 4)

    def forward(self, feats):
        x = F.adaptive_max_pool2d(feats, 3).flatten(1)
        x = F.relu(self.fc6(x))
        x = F.relu(self.fc7(x))
        return self.cls_score(x), self.bbox_pred(x)


class Detector(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = VGGBackbone()
        self.box_head = BoxHead(256, cfg["MODEL"]["NUM_CLASSES"])

    def forward(self, images, labels, boxes):
        class_logits, box_regression = self.box_head(self.backbone(to_image_list(images)))
        targets = encode(boxes, cfg["INPUT"]["SIZE"], cfg["MODEL"]["BBOX_REG_WEIGHTS"])
        loss_classifier = F.cross_entropy(class_logits, labels)
        loss_box_reg = smooth_l1_loss(box_regression, targets) / labels.numel()
        return {"loss_classifier": loss_classifier, "loss_box_reg": loss_box_reg}


def make_optimizer(model):
    s = cfg["SOLVER"]
    params = []
    for key, value in model.named_parameters():
        lr, weight_decay = s["BASE_LR"], s["WEIGHT_DECAY"]
        if "bias" in key:
            lr = s["BASE_LR"] * s["BIAS_LR_FACTOR"]
            weight_decay = s["WEIGHT_DECAY_BIAS"]
        params.append({"params": [value], "lr": lr, "weight_decay": weight_decay})
    return torch.optim.SGD(params, lr=s["BASE_LR"], momentum=s["MOMENTUM"])


class WarmupMultiStepLR(torch.optim.lr_scheduler._LRScheduler):
    def __init__(self, optimizer, milestones, gamma, warmup_factor, warmup_iters):
        self.milestones, self.gamma = milestones, gamma
        self.warmup_factor, self.warmup_iters = warmup_factor, warmup_iters
        super().__init__(optimizer)

    def get_lr(self):
        factor = 1.0
        if self.last_epoch < self.warmup_iters:
            alpha = self.last_epoch / self.warmup_iters
            factor = self.warmup_factor * (1 - alpha) + alpha
        n = sum(1 for m in self.milestones if m <= self.last_epoch)
        return [base * factor * self.gamma ** n for base in self.base_lrs]


class MetricLogger:
    def __init__(self, window=20):
        self.meters = defaultdict(lambda: deque(maxlen=window))

    def update(self, **kwargs):
        for k, v in kwargs.items():
            self.meters[k].append(v.item() if torch.is_tensor(v) else float(v))

    def __str__(self):
        parts = []
        for k, q in self.meters.items():
            vals = sorted(q)
            parts.append(f"{k}: {vals[len(vals) // 2]:.4f} ({sum(q) / len(q):.4f})")
        return "  ".join(parts)


def collate(batch):
    imgs, labels, boxes = zip(*batch)
    return torch.stack(imgs), torch.tensor(labels), torch.stack(boxes)


def do_train(model, loader, optimizer, scheduler, max_iter):
    meters = MetricLogger()
    model.train()
    iteration = 0
    while iteration < max_iter:
        for images, labels, boxes in loader:
            iteration += 1
            loss_dict = model(images, labels, boxes)
            losses = sum(loss_dict.values())
            meters.update(loss=losses, **loss_dict)
            optimizer.zero_grad()
            losses.backward()
            optimizer.step()
            scheduler.step()
            if iteration % 20 == 0 or iteration == max_iter:
                lr = optimizer.param_groups[0]["lr"]
                print(f"iter: {iteration}  {meters}  lr: {lr:.6f}")
            if iteration >= max_iter:
                break


def main():
    torch.manual_seed(0)
    s = cfg["SOLVER"]
    dataset = SyntheticScenes(800, cfg["INPUT"]["SIZE"], seed=1)
    loader = DataLoader(dataset, batch_size=s["IMS_PER_BATCH"], shuffle=True,
                        collate_fn=collate, drop_last=True)
    model = Detector()
    optimizer = make_optimizer(model)
    scheduler = WarmupMultiStepLR(optimizer, s["STEPS"], s["GAMMA"],
                                  s["WARMUP_FACTOR"], s["WARMUP_ITERS"])
    do_train(model, loader, optimizer, scheduler, s["MAX_ITER"])


if __name__ == "__main__":
    main()
