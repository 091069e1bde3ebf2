"""Few-shot YOLOv2-style detector fine-tuned with a small batch: loss goes NaN.

A reweighting few-shot detector (darknet-19-like backbone + region loss, as in
the Fewshot_Detection repo) is trained with a learning rate tuned for the
large-batch cfg (0.004 here, momentum 0.9, decay 0.0005).  The user only has
memory for batch 8; the region loss is summed over all anchors of the batch,
and with the unchanged lr the box/objectness regression becomes unstable: the
number of proposals collapses to 0, the loss oscillates upwards and turns NaN
after ~45 batches
("The number of proposals are reduced to zeros after a few iterations, and
later the loss becomes nan").

Report: https://github.com/bingykang/Fewshot_Detection/issues/43
Fix (from the thread): when the batch decreases the lr should decrease too -
batch 8 with learning_rate = 0.0001 trains fine.
"""
import argparse
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader

ANCHORS = [(1.3, 1.7), (3.2, 4.0), (5.0, 2.5), (2.0, 5.5), (6.0, 6.0)]
NUM_CLASSES = 5


def parse_cfg():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)          # cfg: batch=64, lowered for memory
    p.add_argument("--learning_rate", type=float, default=0.004)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--decay", type=float, default=0.0005)
    p.add_argument("--max_batches", type=int, default=100)
    return p.parse_args()


class ShapesDetection(Dataset):
    """Synthetic 'novel class' images: coloured rectangles on noise, 1-3 per image."""

    def __init__(self, n=256, size=64, seed=0):
        rng = np.random.RandomState(seed)
        self.items = []
        for _ in range(n):
            img = rng.rand(3, size, size).astype(np.float32) * 0.3
            boxes = []
            for _ in range(rng.randint(1, 4)):
                cls = rng.randint(NUM_CLASSES)
                w, h = rng.uniform(0.15, 0.6, 2)
                cx, cy = rng.uniform(w / 2, 1 - w / 2), rng.uniform(h / 2, 1 - h / 2)
                x0, x1 = int((cx - w / 2) * size), int((cx + w / 2) * size)
                y0, y1 = int((cy - h / 2) * size), int((cy + h / 2) * size)
                img[cls % 3, y0:y1, x0:x1] += 0.5 + 0.1 * cls
                boxes.append([cls, cx, cy, w, h])
            self.items.append((img, np.array(boxes, np.float32)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        img, boxes = self.items[i]
        target = np.zeros((10, 5), np.float32)          # darknet-style padded label block
        target[: len(boxes)] = boxes
        return torch.from_numpy(img), torch.from_numpy(target)


def conv_bn(cin, cout, k=3):
    return nn.Sequential(nn.Conv2d(cin, cout, k, 1, k // 2, bias=False),
                         nn.BatchNorm2d(cout), nn.LeakyReLU(0.1))


class Darknet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            conv_bn(3, 16), nn.MaxPool2d(2),
            conv_bn(16, 32), nn.MaxPool2d(2),
            conv_bn(32, 64), nn.MaxPool2d(2),
            conv_bn(64, 128), conv_bn(128, 64, 1), conv_bn(64, 128))
        self.head = nn.Conv2d(128, len(ANCHORS) * (5 + NUM_CLASSES), 1)

    def forward(self, x):
        return self.head(self.features(x))


def region_loss(output, target, object_scale=5.0, noobject_scale=1.0, coord_scale=1.0):
    nB, _, nH, nW = output.shape
    nA = len(ANCHORS)
    out = output.view(nB, nA, 5 + NUM_CLASSES, nH, nW)
    x, y = torch.sigmoid(out[:, :, 0]), torch.sigmoid(out[:, :, 1])
    w, h = out[:, :, 2], out[:, :, 3]
    conf = torch.sigmoid(out[:, :, 4])
    cls = out[:, :, 5:].permute(0, 1, 3, 4, 2)

    anchors = torch.tensor(ANCHORS)
    coord_mask = torch.zeros(nB, nA, nH, nW)
    conf_mask = torch.full((nB, nA, nH, nW), noobject_scale)
    tx, ty, tw, th = (torch.zeros(nB, nA, nH, nW) for _ in range(4))
    tconf = torch.zeros(nB, nA, nH, nW)
    tcls = torch.zeros(nB, nA, nH, nW, dtype=torch.long)
    for b in range(nB):
        for t in range(target.shape[1]):
            c, gx, gy, gw, gh = target[b, t].tolist()
            if gw == 0:
                break
            gx, gy, gw, gh = gx * nW, gy * nH, gw * nW, gh * nH
            gi, gj = min(int(gx), nW - 1), min(int(gy), nH - 1)
            inter = torch.minimum(anchors[:, 0], torch.tensor(gw)) * torch.minimum(anchors[:, 1], torch.tensor(gh))
            iou = inter / (anchors[:, 0] * anchors[:, 1] + gw * gh - inter)
            a = int(iou.argmax())
            coord_mask[b, a, gj, gi] = 1
            conf_mask[b, a, gj, gi] = object_scale
            tx[b, a, gj, gi], ty[b, a, gj, gi] = gx - gi, gy - gj
            tw[b, a, gj, gi] = math.log(gw / ANCHORS[a][0])
            th[b, a, gj, gi] = math.log(gh / ANCHORS[a][1])
            tconf[b, a, gj, gi] = 1.0
            tcls[b, a, gj, gi] = int(c)

    # summed (size_average=False) like the original region loss
    loss_x = coord_scale * ((x - tx) ** 2 * coord_mask).sum() / 2
    loss_y = coord_scale * ((y - ty) ** 2 * coord_mask).sum() / 2
    loss_w = coord_scale * ((w - tw) ** 2 * coord_mask).sum() / 2
    loss_h = coord_scale * ((h - th) ** 2 * coord_mask).sum() / 2
    loss_conf = ((conf - tconf) ** 2 * conf_mask).sum() / 2
    m = coord_mask.bool()
    loss_cls = F.cross_entropy(cls[m], tcls[m], reduction="sum")
    nproposals = int((conf > 0.25).sum())
    return loss_x + loss_y + loss_w + loss_h + loss_conf + loss_cls, nproposals


def main():
    args = parse_cfg()
    torch.manual_seed(0)
    np.random.seed(0)
    loader = DataLoader(ShapesDetection(), batch_size=args.batch, shuffle=True, drop_last=True)
    model = Darknet()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate,
                                momentum=args.momentum, weight_decay=args.decay * args.batch)
    processed = 0
    model.train()
    while processed < args.max_batches:
        for images, targets in loader:
            output = model(images)
            loss, nprop = region_loss(output, targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            processed += 1
            if processed % 5 == 0:
                print(f"{processed}: nProposals {nprop}, loss: {loss.item():.4f}, lr {args.learning_rate}")
            if processed >= args.max_batches:
                break


if __name__ == "__main__":
    main()
