"""Single-shot face detector (SSD-VGG with L2Norm) on synthetic WIDER-FACE-like images.

A scaled-down version of mmdetection's ssd300_wider_face setup written in plain PyTorch:
caffe-style input (BGR mean subtraction, no std), VGG-style backbone without batch norm,
L2Norm(scale=20) on the first source feature map, an extra stride-2 stage, 2 anchors per
location, MaxIoU assignment at 0.35, hard negative mining at 3:1, smooth-L1 on
DeltaXYWH-encoded targets (stds 0.1/0.2), SGD with linear warm-up.  The whole run is driven by
a config dict in the style of an mmdet config file.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

cfg = dict(
    input_size=64,
    model=dict(anchor_sizes=((6, 8.4), (14, 19.6), (28, 39.2)), feat_sizes=(16, 8, 4), l2_norm_scale=20.0,
               pos_iou_thr=0.35, neg_pos_ratio=3, target_stds=(0.1, 0.1, 0.2, 0.2)),
    data=dict(samples_per_gpu=4, num_train=120, pixel_mean=(104.0, 117.0, 123.0)),
    optimizer=dict(type="SGD", lr=0.03, momentum=0.9, weight_decay=5e-4),
    optimizer_config=dict(grad_clip=None),
    lr_config=dict(warmup="linear", warmup_iters=50, warmup_ratio=0.001, step=[16, 20]),
    runner=dict(max_epochs=6),
    log_config=dict(interval=5),
    seed=0,
)


def vgg_stage(channels, in_channels, pool_first):
    layers = [nn.MaxPool2d(2, ceil_mode=True)] if pool_first else []
    for c in channels:
        layers += [nn.Conv2d(in_channels, c, 3, padding=1), nn.ReLU(inplace=True)]
        in_channels = c
    return nn.Sequential(*layers)


class L2Norm(nn.Module):
    def __init__(self, channels, scale):
        super().__init__()
        self.weight = nn.Parameter(torch.full((channels,), scale))

    def forward(self, x):
        norm = x.pow(2).sum(1, keepdim=True).sqrt() + 1e-10
        return x / norm * self.weight.view(1, -1, 1, 1)


class SSDVGG(nn.Module):
    def __init__(self, l2_norm_scale, num_anchors=2, num_classes=2):
        super().__init__()
        self.stage1 = nn.Sequential(vgg_stage([16, 16], 3, False), vgg_stage([32, 32], 16, True),
                                    vgg_stage([64, 64, 64], 32, True))
        self.l2_norm = L2Norm(64, l2_norm_scale)
        self.stage2 = vgg_stage([64, 64, 64], 64, True)
        self.extra = nn.Sequential(nn.Conv2d(64, 32, 1), nn.ReLU(inplace=True),
                                   nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(inplace=True))
        self.cls_convs = nn.ModuleList([nn.Conv2d(64, num_anchors * num_classes, 3, padding=1) for _ in range(3)])
        self.reg_convs = nn.ModuleList([nn.Conv2d(64, num_anchors * 4, 3, padding=1) for _ in range(3)])
        self.num_classes = num_classes
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        f1 = self.stage1(x)
        f2 = self.stage2(f1)
        f3 = self.extra(f2)
        feats = [self.l2_norm(f1), f2, f3]
        n = x.size(0)
        cls_scores = torch.cat([conv(f).permute(0, 2, 3, 1).reshape(n, -1, self.num_classes)
                                for conv, f in zip(self.cls_convs, feats)], 1)
        bbox_preds = torch.cat([conv(f).permute(0, 2, 3, 1).reshape(n, -1, 4)
                                for conv, f in zip(self.reg_convs, feats)], 1)
        return cls_scores, bbox_preds


def make_anchors(input_size, feat_sizes, anchor_sizes):
    anchors = []
    for fs, sizes in zip(feat_sizes, anchor_sizes):
        stride = input_size / fs
        for i in range(fs):
            for j in range(fs):
                cx, cy = (j + 0.5) * stride, (i + 0.5) * stride
                for s in sizes:
                    anchors.append([cx - s / 2, cy - s / 2, cx + s / 2, cy + s / 2])
    return torch.tensor(anchors)


def box_iou(a, b):
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / (area_a[:, None] + area_b[None] - inter)


def delta_xywh_encode(anchors, gts, stds):
    aw, ah = anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1]
    ax, ay = anchors[:, 0] + aw / 2, anchors[:, 1] + ah / 2
    gw, gh = gts[:, 2] - gts[:, 0], gts[:, 3] - gts[:, 1]
    gx, gy = gts[:, 0] + gw / 2, gts[:, 1] + gh / 2
    deltas = torch.stack([(gx - ax) / aw, (gy - ay) / ah, torch.log(gw / aw), torch.log(gh / ah)], 1)
    return deltas / torch.tensor(stds)


def ssd_loss(cls_scores, bbox_preds, gt_bboxes, anchors, mcfg):
    loss_cls, loss_bbox, num_pos_total = 0.0, 0.0, 0
    for cls_score, bbox_pred, gts in zip(cls_scores, bbox_preds, gt_bboxes):
        overlaps = box_iou(anchors, gts)
        max_overlap, argmax = overlaps.max(1)
        best_anchor = overlaps.argmax(0)
        max_overlap[best_anchor] = 1.0
        argmax[best_anchor] = torch.arange(len(gts))
        labels = (max_overlap >= mcfg["pos_iou_thr"]).long()
        pos = labels > 0
        num_pos = int(pos.sum())
        num_pos_total += num_pos
        ce = F.cross_entropy(cls_score, labels, reduction="none")
        neg_ce = ce.detach().clone()
        neg_ce[pos] = 0
        topk = min(mcfg["neg_pos_ratio"] * num_pos, int((~pos).sum()))
        hard_neg = neg_ce.topk(topk).indices
        loss_cls = loss_cls + ce[pos].sum() + ce[hard_neg].sum()
        targets = delta_xywh_encode(anchors[pos], gts[argmax[pos]], mcfg["target_stds"])
        loss_bbox = loss_bbox + F.smooth_l1_loss(bbox_pred[pos], targets, beta=1.0, reduction="sum")
    num_pos_total = max(num_pos_total, 1)
    return loss_cls / num_pos_total, loss_bbox / num_pos_total


def synthetic_wider_face(n, size, pixel_mean, gen):
    """Crowded scenes: 1-11 small skin-coloured 'faces' per image, returned as BGR 0..255 - mean."""
    imgs, boxes = [], []
    for _ in range(n):
        img = torch.rand(3, size, size, generator=gen) * 80 + 60
        bb = []
        for _ in range(int(torch.randint(1, 12, (1,), generator=gen))):
            w = int(torch.randint(3, 20, (1,), generator=gen))
            h = int(w * 1.2) + 1
            x, y = torch.randint(0, size - h - 1, (2,), generator=gen).tolist()
            img[:, y:y + h, x:x + w] = torch.tensor([140.0, 160.0, 200.0]).view(3, 1, 1) + torch.randn(3, 1, 1, generator=gen) * 20
            bb.append([x, y, x + w, y + h])
        imgs.append(img - torch.tensor(pixel_mean).view(3, 1, 1))
        boxes.append(torch.tensor(bb, dtype=torch.float))
    return torch.stack(imgs), boxes


def lr_at(iteration, epoch, base_lr, lr_cfg):
    lr = base_lr * (0.1 ** sum(epoch >= s for s in lr_cfg["step"]))
    if iteration < lr_cfg["warmup_iters"]:
        k = (1 - iteration / lr_cfg["warmup_iters"]) * (1 - lr_cfg["warmup_ratio"])
        lr = lr * (1 - k)
    return lr


def main():
    torch.manual_seed(cfg["seed"])
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(cfg["seed"])
    mcfg, dcfg = cfg["model"], cfg["data"]
    images, gt_bboxes = synthetic_wider_face(dcfg["num_train"], cfg["input_size"], dcfg["pixel_mean"], gen)
    anchors = make_anchors(cfg["input_size"], mcfg["feat_sizes"], mcfg["anchor_sizes"])

    model = SSDVGG(mcfg["l2_norm_scale"])
    ocfg = cfg["optimizer"]
    optimizer = torch.optim.SGD(model.parameters(), lr=ocfg["lr"], momentum=ocfg["momentum"],
                                weight_decay=ocfg["weight_decay"])
    grad_clip = cfg["optimizer_config"]["grad_clip"]
    bs = dcfg["samples_per_gpu"]
    iters_per_epoch = len(images) // bs
    it = 0
    for epoch in range(cfg["runner"]["max_epochs"]):
        perm = torch.randperm(len(images), generator=gen)
        for i in range(iters_per_epoch):
            lr = lr_at(it, epoch, ocfg["lr"], cfg["lr_config"])
            for group in optimizer.param_groups:
                group["lr"] = lr
            idx = perm[i * bs:(i + 1) * bs]
            cls_scores, bbox_preds = model(images[idx])
            loss_cls, loss_bbox = ssd_loss(cls_scores, bbox_preds, [gt_bboxes[int(j)] for j in idx], anchors, mcfg)
            loss = loss_cls + loss_bbox
            optimizer.zero_grad()
            loss.backward()
            if grad_clip is not None:
                grad_norm = nn.utils.clip_grad_norm_(model.parameters(), **grad_clip)
            optimizer.step()
            it += 1
            if (i + 1) % cfg["log_config"]["interval"] == 0:
                msg = (f"Epoch [{epoch + 1}][{i + 1}/{iters_per_epoch}]\tlr: {lr:.3e}, "
                       f"loss_cls: {loss_cls.item():.4f}, loss_bbox: {loss_bbox.item():.4f}, loss: {loss.item():.4f}")
                if grad_clip is not None:
                    msg += f", grad_norm: {grad_norm:.4f}"
                print(msg)


if __name__ == "__main__":
    main()
