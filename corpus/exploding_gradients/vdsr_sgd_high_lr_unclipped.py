"""VDSR (very deep super-resolution) trained on synthetic luminance patches.

20 conv layers with ReLU, global residual connection, MSE on the summed pixels,
SGD with momentum at a high initial learning rate and a step decay.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class PatchDataset(Dataset):
    """Random smooth textures; input is the bicubic-upsampled low-res version."""

    def __init__(self, n, size=24, scale=2, seed=0):
        g = torch.Generator().manual_seed(seed)
        coarse = torch.rand(n, 1, size // 4, size // 4, generator=g)
        hr = F.interpolate(coarse, size=size, mode="bicubic", align_corners=False)
        hr = hr + 0.15 * torch.rand(n, 1, size, size, generator=g)
        self.hr = hr.clamp(0, 1)
        lr = F.interpolate(self.hr, scale_factor=1 / scale, mode="bicubic", align_corners=False)
        self.lr_up = F.interpolate(lr, size=size, mode="bicubic", align_corners=False)

    def __len__(self):
        return len(self.hr)

    def __getitem__(self, idx):
        return self.lr_up[idx], self.hr[idx]


class ConvReLUBlock(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, 1, 1, bias=False)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.conv(x))


class VDSR(nn.Module):
    def __init__(self, depth=20, ch=16):
        super().__init__()
        self.input = nn.Conv2d(1, ch, 3, 1, 1, bias=False)
        self.residual_layer = nn.Sequential(*[ConvReLUBlock(ch) for _ in range(depth - 2)])
        self.output = nn.Conv2d(ch, 1, 3, 1, 1, bias=False)
        self.relu = nn.ReLU(inplace=True)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, math.sqrt(2.0 / n))

    def forward(self, x):
        residual = x
        out = self.relu(self.input(x))
        out = self.residual_layer(out)
        out = self.output(out)
        return out + residual


def adjust_learning_rate(opt, epoch):
    return opt.lr * (0.1 ** (epoch // opt.step))


def train(loader, optimizer, model, criterion, epoch, opt):
    lr = adjust_learning_rate(opt, epoch)
    for group in optimizer.param_groups:
        group["lr"] = lr
    print(f"Epoch = {epoch}, lr = {lr}")
    model.train()
    for it, (inp, target) in enumerate(loader, 1):
        loss = criterion(model(inp), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if it % 5 == 0:
            print(f"===> Epoch[{epoch}]({it}/{len(loader)}): Loss: {loss.item():.10f}")


def main():
    parser = argparse.ArgumentParser(description="PyTorch VDSR")
    parser.add_argument("--batchSize", type=int, default=32)
    parser.add_argument("--nEpochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--step", type=int, default=10)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=7)
    opt = parser.parse_args()

    torch.manual_seed(opt.seed)
    loader = DataLoader(PatchDataset(480, seed=opt.seed), batch_size=opt.batchSize, shuffle=True)
    model = VDSR()
    criterion = nn.MSELoss(reduction="sum")
    optimizer = torch.optim.SGD(model.parameters(), lr=opt.lr, momentum=opt.momentum,
                                weight_decay=opt.weight_decay)
    for epoch in range(1, opt.nEpochs + 1):
        train(loader, optimizer, model, criterion, epoch, opt)


if __name__ == "__main__":
    main()
