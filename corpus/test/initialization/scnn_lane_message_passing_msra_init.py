"""Lane segmentation with a small SCNN (spatial CNN) head, trained from scratch.

Synthetic road images with up to four painted lanes; per-pixel lane-id segmentation
(background + 4 lanes) with a CNN backbone followed by SCNN slice-by-slice message
passing (down, up, right, left).
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class SyntheticLanes(Dataset):
    def __init__(self, n, height=48, width=96, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.zeros(n, 3, height, width)
        self.masks = torch.zeros(n, height, width, dtype=torch.long)
        ys = torch.arange(height).float()
        for i in range(n):
            img = 0.3 * torch.rand(3, height, width, generator=g)
            for lane in range(4):
                if torch.rand(1, generator=g).item() < 0.2:
                    continue
                x0 = width * (0.15 + 0.23 * lane) + 4 * torch.randn(1, generator=g).item()
                slope = (lane - 1.5) * 0.35 + 0.05 * torch.randn(1, generator=g).item()
                xs = (x0 + slope * (ys - height)).round().long()
                for y, x in zip(range(height), xs.tolist()):
                    if 0 <= x < width - 1:
                        img[:, y, x:x + 2] = 0.9
                        self.masks[i, y, x:x + 2] = lane + 1
            self.images[i] = img

    def __len__(self):
        return len(self.images)

    def __getitem__(self, idx):
        return self.images[idx], self.masks[idx]


def conv_bn(cin, cout, stride=1):
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class SCNN(nn.Module):
    def __init__(self, channels, kernel=9):
        super().__init__()
        pad = kernel // 2
        self.conv_d = nn.Conv2d(channels, channels, (1, kernel), padding=(0, pad), bias=False)
        self.conv_u = nn.Conv2d(channels, channels, (1, kernel), padding=(0, pad), bias=False)
        self.conv_r = nn.Conv2d(channels, channels, (kernel, 1), padding=(pad, 0), bias=False)
        self.conv_l = nn.Conv2d(channels, channels, (kernel, 1), padding=(pad, 0), bias=False)
        for conv in (self.conv_d, self.conv_u, self.conv_r, self.conv_l):
            fan_in = conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
            nn.init.normal_(conv.weight, 0.0, math.sqrt(2.0 / fan_in))

    def forward(self, x):
        rows = list(x.split(1, dim=2))
        for i in range(1, len(rows)):
            rows[i] = rows[i] + F.relu(self.conv_d(rows[i - 1]))
        for i in range(len(rows) - 2, -1, -1):
            rows[i] = rows[i] + F.relu(self.conv_u(rows[i + 1]))
        x = torch.cat(rows, dim=2)
        cols = list(x.split(1, dim=3))
        for i in range(1, len(cols)):
            cols[i] = cols[i] + F.relu(self.conv_r(cols[i - 1]))
        for i in range(len(cols) - 2, -1, -1):
            cols[i] = cols[i] + F.relu(self.conv_l(cols[i + 1]))
        return torch.cat(cols, dim=3)


class LaneNet(nn.Module):
    def __init__(self, num_classes=5, width=16):
        super().__init__()
        self.backbone = nn.Sequential(
            conv_bn(3, width), conv_bn(width, width, stride=2), conv_bn(width, width)
        )
        self.scnn = SCNN(width)
        self.dropout = nn.Dropout2d(0.1)
        self.classifier = nn.Conv2d(width, num_classes, 1)

    def forward(self, x):
        h, w = x.shape[-2:]
        feat = self.scnn(self.backbone(x))
        logits = self.classifier(self.dropout(feat))
        return F.interpolate(logits, size=(h, w), mode="bilinear", align_corners=False)


def train(args):
    torch.manual_seed(args.seed)
    loader = DataLoader(SyntheticLanes(args.n_images, seed=args.seed), batch_size=args.batch_size,
                        shuffle=True)
    model = LaneNet()
    class_weights = torch.tensor([0.4, 1.0, 1.0, 1.0, 1.0])
    criterion = nn.CrossEntropyLoss(weight=class_weights)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    step = 0
    for epoch in range(args.epochs):
        model.train()
        for images, masks in loader:
            logits = model(images)
            loss = criterion(logits, masks)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 2 == 0:
                print(f"epoch {epoch} step {step:4d}  seg_loss {loss.item():.4f}")
    print("done")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--n-images", type=int, default=96)
    parser.add_argument("--seed", type=int, default=3)
    train(parser.parse_args())


if __name__ == "__main__":
    main()
