"""Toy two-stage detector trained with a faster-rcnn.pytorch style trainval loop.

Images are caffe-style BGR with the pixel mean subtracted (no division by a std), the
backbone is either a plain VGG-like conv stack or a residual stack whose BatchNorm layers
are frozen (fixed affine, as when fine-tuning a detection backbone with small batches), an
RPN-like dense head scores every feature cell and regresses box offsets, and an RCNN head
classifies the pooled object feature and refines its box.  Training is SGD with momentum;
the trainval loop only calls clip_gradient(model, 10.) when --net is vgg16.

Report: https://github.com/jwyang/faster-rcnn.pytorch/issues/39 ("loss nan": training with
--net res101 gives NaN loss after a few iterations; the maintainer: "one way is to clamp
the gradient for res101 as well by comment this line", i.e. the `if args.net == "vgg16":`
guard in front of clip_gradient(fasterRCNN, 10.) in trainval_net.py).
"""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

PIXEL_MEANS = np.array([[[102.9801, 115.9465, 122.7717]]], dtype=np.float32)
CLASSES = ("__background__", "square", "disc", "bar")


def parse_args():
    parser = argparse.ArgumentParser(description="Train a toy Faster R-CNN")
    parser.add_argument("--net", dest="net", default="res101", type=str,
                        help="vgg16, res101")
    parser.add_argument("--epochs", dest="max_epochs", default=2, type=int)
    parser.add_argument("--bs", dest="batch_size", default=4, type=int)
    parser.add_argument("--lr", dest="lr", default=0.003, type=float)
    parser.add_argument("--disp_interval", dest="disp_interval", default=10, type=int)
    parser.add_argument("--session", dest="session", default=1, type=int)
    return parser.parse_args()


class ToyShapes(Dataset):
    def __init__(self, n=480, size=64, seed=0):
        rng = np.random.RandomState(seed)
        self.images, self.boxes, self.labels = [], [], []
        yy, xx = np.mgrid[0:size, 0:size]
        for _ in range(n):
            img = rng.uniform(0, 80, size=(size, size, 3)).astype(np.float32)
            cls = rng.randint(1, len(CLASSES))
            w, h = rng.randint(16, 36, size=2)
            if cls == 3:
                w, h = rng.randint(30, 48), 16
            x1, y1 = rng.randint(0, size - w), rng.randint(0, size - h)
            color = rng.uniform(140, 255, size=3)
            if cls == 2:
                cx, cy = x1 + w / 2, y1 + h / 2
                mask = ((xx - cx) / (w / 2)) ** 2 + ((yy - cy) / (h / 2)) ** 2 <= 1
            else:
                mask = (xx >= x1) & (xx < x1 + w) & (yy >= y1) & (yy < y1 + h)
            img[mask] = color
            self.images.append(img - PIXEL_MEANS)
            self.boxes.append(np.array([x1, y1, x1 + w, y1 + h], np.float32))
            self.labels.append(cls)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        im = torch.from_numpy(self.images[i]).permute(2, 0, 1)
        return im, torch.from_numpy(self.boxes[i]), torch.tensor(self.labels[i])


class FrozenBN(nn.Module):
    """BatchNorm with frozen statistics and affine parameters (identity here)."""

    def __init__(self, c):
        super().__init__()
        self.register_buffer("weight", torch.ones(c))
        self.register_buffer("bias", torch.zeros(c))

    def forward(self, x):
        return x * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


class Bottleneck(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c // 2, 1, bias=False), FrozenBN(c // 2)
        self.conv2, self.bn2 = nn.Conv2d(c // 2, c // 2, 3, padding=1, bias=False), FrozenBN(c // 2)
        self.conv3, self.bn3 = nn.Conv2d(c // 2, c, 1, bias=False), FrozenBN(c)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + x)


def build_backbone(net):
    if net == "vgg16":
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU())
    layers = [nn.Conv2d(3, 32, 7, stride=2, padding=3, bias=False), FrozenBN(32), nn.ReLU(),
              nn.MaxPool2d(2)]
    for stage in range(3):
        layers += [Bottleneck(32) for _ in range(3)]
        if stage < 1:
            layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class ToyFasterRCNN(nn.Module):
    def __init__(self, net, stride=8, size=64):
        super().__init__()
        self.base = build_backbone(net)
        self.stride, self.size = stride, size
        self.rpn_conv = nn.Conv2d(32, 32, 3, padding=1)
        self.rpn_cls_score = nn.Conv2d(32, 1, 1)
        self.rpn_bbox_pred = nn.Conv2d(32, 4, 1)
        self.rcnn_top = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.rcnn_cls_score = nn.Linear(64, len(CLASSES))
        self.rcnn_bbox_pred = nn.Linear(64, 4)

    def forward(self, im_data, gt_boxes, gt_labels):
        feat = self.base(im_data)
        n, _, fh, fw = feat.shape
        rpn = F.relu(self.rpn_conv(feat))
        # RPN targets: a cell is foreground when its centre lies inside the gt box
        cy = (torch.arange(fh, dtype=torch.float32) + 0.5) * self.stride
        cx = (torch.arange(fw, dtype=torch.float32) + 0.5) * self.stride
        cyy, cxx = torch.meshgrid(cy, cx, indexing="ij")
        b = gt_boxes.view(n, 4, 1, 1)
        inside = ((cxx >= b[:, 0]) & (cxx < b[:, 2]) & (cyy >= b[:, 1]) & (cyy < b[:, 3])).float()
        rpn_loss_cls = F.binary_cross_entropy_with_logits(self.rpn_cls_score(rpn).squeeze(1), inside)
        deltas = torch.stack([b[:, 0] - cxx, b[:, 1] - cyy, b[:, 2] - cxx, b[:, 3] - cyy], 1)
        pos = inside.unsqueeze(1).expand_as(deltas) > 0
        rpn_loss_box = F.smooth_l1_loss(self.rpn_bbox_pred(rpn)[pos], deltas[pos] / self.stride)
        # RCNN head on the feature pooled inside the gt box (stands in for RoI pooling)
        weights = inside / inside.sum(dim=(1, 2), keepdim=True).clamp(min=1.0)
        pooled = (feat * weights.unsqueeze(1)).sum(dim=(2, 3))
        top = self.rcnn_top(pooled)
        rcnn_loss_cls = F.cross_entropy(self.rcnn_cls_score(top), gt_labels)
        rcnn_loss_bbox = F.smooth_l1_loss(self.rcnn_bbox_pred(top), gt_boxes / self.size)
        fg_cnt = int(inside.sum())
        return rpn_loss_cls, rpn_loss_box, rcnn_loss_cls, rcnn_loss_bbox, fg_cnt, inside.numel() - fg_cnt


def clip_gradient(model, clip_norm):
    """Computes a gradient clipping coefficient based on gradient norm."""
    totalnorm = 0
    for p in model.parameters():
        if p.requires_grad and p.grad is not None:
            totalnorm += p.grad.data.norm() ** 2
    totalnorm = torch.sqrt(totalnorm).item()
    norm = clip_norm / max(totalnorm, clip_norm)
    for p in model.parameters():
        if p.requires_grad and p.grad is not None:
            p.grad.mul_(norm)


if __name__ == "__main__":
    args = parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(3)
    dataset = ToyShapes()
    dataloader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(3))
    fasterRCNN = ToyFasterRCNN(args.net)
    lr = args.lr
    params = []
    for key, value in dict(fasterRCNN.named_parameters()).items():
        if value.requires_grad:
            if "bias" in key:
                params += [{"params": [value], "lr": lr * 2, "weight_decay": 0}]
            else:
                params += [{"params": [value], "lr": lr, "weight_decay": 1e-4}]
    optimizer = torch.optim.SGD(params, momentum=0.9)
    iters_per_epoch = len(dataloader)

    for epoch in range(1, args.max_epochs + 1):
        fasterRCNN.train()
        loss_temp = 0
        start = time.time()
        for step, (im_data, gt_boxes, gt_labels) in enumerate(dataloader):
            rpn_loss_cls, rpn_loss_box, RCNN_loss_cls, RCNN_loss_bbox, fg_cnt, bg_cnt = \
                fasterRCNN(im_data, gt_boxes, gt_labels)
            loss = rpn_loss_cls.mean() + rpn_loss_box.mean() \
                + RCNN_loss_cls.mean() + RCNN_loss_bbox.mean()
            loss_temp += loss.item()

            # backward
            optimizer.zero_grad()
            loss.backward()
            if args.net == "vgg16":
                clip_gradient(fasterRCNN, 10.)
            optimizer.step()

            if step % args.disp_interval == 0:
                end = time.time()
                if step > 0:
                    loss_temp /= args.disp_interval
                print("[session %d][epoch %2d][iter %4d/%4d] loss: %.4f, lr: %.2e"
                      % (args.session, epoch, step, iters_per_epoch, loss_temp, lr))
                print("\t\t\tfg/bg=(%d/%d), time cost: %f" % (fg_cnt, bg_cnt, end - start))
                print("\t\t\trpn_cls: %.4f, rpn_box: %.4f, rcnn_cls: %.4f, rcnn_box %.4f"
                      % (rpn_loss_cls.item(), rpn_loss_box.item(), RCNN_loss_cls.item(),
                         RCNN_loss_bbox.item()))
                loss_temp = 0
                start = time.time()
