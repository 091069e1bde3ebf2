"""CSRNet-style crowd counting: VGG-like front end, dilated back end, density-map regression.

Synthetic "crowd" images are generated on the fly: every head is a dark dot and the ground
truth is the usual sum-normalised Gaussian density map, down-sampled by 8 (and multiplied by
64 so that it still sums to the head count), as in the CSRNet data loader.  Training follows
the original train.py: batch size 1, summed MSE, SGD with momentum 0.95 and weight decay 5e-4,
AverageMeter logging every print_freq iterations and a validation MAE after each epoch.
"""
import argparse
import math
import random
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def make_layers(cfg, in_channels=3, dilation=False):
    d_rate = 2 if dilation else 1
    layers = []
    for v in cfg:
        if v == "M":
            layers += [nn.MaxPool2d(kernel_size=2, stride=2)]
        else:
            layers += [nn.Conv2d(in_channels, v, kernel_size=3, padding=d_rate, dilation=d_rate),
                       nn.ReLU(inplace=True)]
            in_channels = v
    return nn.Sequential(*layers)


class CSRNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.frontend_feat = [16, 16, "M", 32, 32, "M", 64, 64, "M", 64]
        self.backend_feat = [64, 64, 32, 16]
        self.frontend = make_layers(self.frontend_feat)
        self.backend = make_layers(self.backend_feat, in_channels=64, dilation=True)
        self.output_layer = nn.Conv2d(16, 1, kernel_size=1)
        self._initialize_weights()

    def forward(self, x):
        x = self.frontend(x)
        x = self.backend(x)
        return self.output_layer(x)

    def _initialize_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.constant_(m.bias, 0)


class CrowdDataset(Dataset):
    """Random scenes with 2..400 people; returns (normalised image, density map / 8 * 64)."""

    def __init__(self, n_images, size=64, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.samples = [self._make_scene(g, size) for _ in range(n_images)]

    @staticmethod
    def _make_scene(g, size):
        dense = torch.rand(1, generator=g).item() < 0.2
        n_people = int(torch.randint(150, 400, (1,), generator=g)) if dense else int(torch.randint(2, 120, (1,), generator=g))
        img = torch.rand(3, size, size, generator=g) * 0.4 + 0.3
        heads = torch.rand(n_people, 2, generator=g) * size
        yy, xx = torch.meshgrid(torch.arange(size) + 0.5, torch.arange(size) + 0.5, indexing="ij")
        density = torch.zeros(size, size)
        for hx, hy in heads:
            k = torch.exp(-((xx - hx) ** 2 + (yy - hy) ** 2) / (2 * 1.5 ** 2))
            density += k / k.sum()
            img[:, int(hy) % size, int(hx) % size] = 0.1
        img = (img - MEAN) / STD
        target = F.avg_pool2d(density[None, None], 8)[0] * 64
        return img, target

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, idx):
        return self.samples[idx]


class AverageMeter:
    def __init__(self):
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


def train(train_loader, model, criterion, optimizer, epoch, args):
    losses, batch_time = AverageMeter(), AverageMeter()
    model.train()
    end = time.time()
    for i, (img, target) in enumerate(train_loader):
        output = model(img)
        loss = criterion(output, target)
        losses.update(loss.item(), img.size(0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batch_time.update(time.time() - end)
        end = time.time()
        if i % args.print_freq == 0:
            print(f"Epoch: [{epoch}][{i}/{len(train_loader)}]\t"
                  f"Time {batch_time.val:.3f} ({batch_time.avg:.3f})\t"
                  f"Loss {losses.val:.4f} ({losses.avg:.4f})")


def validate(val_loader, model):
    model.eval()
    mae = 0.0
    with torch.no_grad():
        for img, target in val_loader:
            mae += abs(model(img).sum().item() - target.sum().item())
    mae /= len(val_loader)
    print(f" * MAE {mae:.3f} ")
    return mae


def main():
    parser = argparse.ArgumentParser(description="PyTorch CSRNet (synthetic crowds)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--momentum", type=float, default=0.95)
    parser.add_argument("--decay", type=float, default=5e-4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--print_freq", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_loader = DataLoader(CrowdDataset(120, seed=args.seed), batch_size=1, shuffle=True)
    val_loader = DataLoader(CrowdDataset(20, seed=args.seed + 1), batch_size=1)

    model = CSRNet()
    criterion = nn.MSELoss(reduction="sum")
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.decay)

    best_prec1 = math.inf
    for epoch in range(args.epochs):
        train(train_loader, model, criterion, optimizer, epoch, args)
        prec1 = validate(val_loader, model)
        if prec1 < best_prec1:
            best_prec1 = prec1
        print(f" * best MAE {best_prec1:.3f} ")


if __name__ == "__main__":
    main()
