"""LapSRN (Laplacian pyramid super-resolution network) x4, trained as in the paper.

Progressive x2 / x4 reconstruction: each pyramid level has a feature-extraction branch
(conv + LeakyReLU stack ending in a transposed conv) that predicts a residual, and an
image-reconstruction branch that upsamples the previous estimate with a bilinear
transposed conv. Both levels are supervised with the L1 Charbonnier loss. Training
patches are generated synthetically (textured grayscale images and their bicubic
down-sampled versions) so the script runs anywhere.
"""
import argparse
import math
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser(description="PyTorch LapSRN")
parser.add_argument("--batchSize", type=int, default=16, help="training batch size")
parser.add_argument("--nEpochs", type=int, default=2, help="number of epochs to train for")
parser.add_argument("--lr", type=float, default=1e-5, help="Learning Rate (paper: 1e-5)")
parser.add_argument("--step", type=int, default=50, help="decay the lr by 10 every n epochs")
parser.add_argument("--momentum", default=0.9, type=float, help="Momentum, Default: 0.9")
parser.add_argument("--weight-decay", "--wd", default=1e-4, type=float, help="weight decay")
parser.add_argument("--patches", type=int, default=256, help="training patches per epoch")
parser.add_argument("--seed", type=int, default=7)


def get_upsample_filter(size):
    """Make a 2D bilinear kernel suitable for upsampling."""
    factor = (size + 1) // 2
    center = factor - 1 if size % 2 == 1 else factor - 0.5
    og = np.ogrid[:size, :size]
    filt = (1 - abs(og[0] - center) / factor) * (1 - abs(og[1] - center) / factor)
    return torch.from_numpy(filt).float()


def texture(rng, size):
    yy, xx = np.mgrid[0:size, 0:size] / size
    img = np.zeros((size, size))
    for _ in range(6):
        fx, fy = rng.uniform(1, 12, 2)
        img += rng.uniform(0.2, 1.0) * np.sin(2 * np.pi * (fx * xx + fy * yy) + rng.uniform(0, 6.3))
    for _ in range(3):
        x0, y0, x1, y1 = np.sort(rng.integers(0, size, 4).reshape(2, 2), axis=0).ravel()
        img[y0:y1 + 1, x0:x1 + 1] += rng.uniform(-1.5, 1.5)
    img = (img - img.min()) / (img.max() - img.min() + 1e-8)
    return img.astype(np.float32)


class LapPyramidPatches(Dataset):
    """(LR 16x16, HR_2x 32x32, HR_4x 64x64) luminance patches in [0, 1]."""

    def __init__(self, n, seed):
        rng = np.random.default_rng(seed)
        hr = torch.from_numpy(np.stack([texture(rng, 64) for _ in range(n)]))[:, None]
        self.label_x4 = hr
        self.label_x2 = F.interpolate(hr, scale_factor=0.5, mode="bicubic", align_corners=False).clamp(0, 1)
        self.input = F.interpolate(hr, scale_factor=0.25, mode="bicubic", align_corners=False).clamp(0, 1)

    def __len__(self):
        return len(self.input)

    def __getitem__(self, i):
        return self.input[i], self.label_x2[i], self.label_x4[i]


class _Conv_Block(nn.Module):
    def __init__(self, channels=32, depth=6):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [nn.Conv2d(channels, channels, 3, 1, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
        layers += [nn.ConvTranspose2d(channels, channels, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
        self.cov_block = nn.Sequential(*layers)

    def forward(self, x):
        return self.cov_block(x)


class Net(nn.Module):
    def __init__(self, channels=32):
        super().__init__()
        self.conv_input = nn.Conv2d(1, channels, 3, 1, 1, bias=False)
        self.relu = nn.LeakyReLU(0.2, inplace=True)
        self.convt_I1 = nn.ConvTranspose2d(1, 1, 4, 2, 1, bias=False)
        self.convt_R1 = nn.Conv2d(channels, 1, 3, 1, 1, bias=False)
        self.convt_F1 = _Conv_Block(channels)
        self.convt_I2 = nn.ConvTranspose2d(1, 1, 4, 2, 1, bias=False)
        self.convt_R2 = nn.Conv2d(channels, 1, 3, 1, 1, bias=False)
        self.convt_F2 = _Conv_Block(channels)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, math.sqrt(2.0 / n))
            if isinstance(m, nn.ConvTranspose2d):
                c1, c2, h, w = m.weight.data.size()
                m.weight.data = get_upsample_filter(h).view(1, 1, h, w).repeat(c1, c2, 1, 1) / c1

    def forward(self, x):
        out = self.relu(self.conv_input(x))
        convt_F1 = self.convt_F1(out)
        HR_2x = self.convt_I1(x) + self.convt_R1(convt_F1)
        convt_F2 = self.convt_F2(convt_F1)
        HR_4x = self.convt_I2(HR_2x) + self.convt_R2(convt_F2)
        return HR_2x, HR_4x


class L1_Charbonnier_loss(nn.Module):
    """L1 Charbonnier loss."""

    def __init__(self):
        super().__init__()
        self.eps = 1e-6

    def forward(self, X, Y):
        diff = X - Y
        error = torch.sqrt(diff * diff + self.eps)
        return torch.sum(error)


def adjust_learning_rate(opt, epoch):
    return opt.lr * (0.1 ** (epoch // opt.step))


def train(loader, optimizer, model, criterion, epoch, opt):
    lr = adjust_learning_rate(opt, epoch - 1)
    for group in optimizer.param_groups:
        group["lr"] = lr
    print("Epoch={}, lr={}".format(epoch, lr))
    model.train()
    for iteration, (inp, label_x2, label_x4) in enumerate(loader, 1):
        HR_2x, HR_4x = model(inp)
        loss_x2 = criterion(HR_2x, label_x2)
        loss_x4 = criterion(HR_4x, label_x4)
        loss = loss_x2 + loss_x4

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        if iteration % 4 == 0:
            psnr = -10 * torch.log10(F.mse_loss(HR_4x, label_x4)).item()
            print("===> Epoch[{}]({}/{}): Loss: {:.4f}  PSNR_x4: {:.2f} dB".format(
                epoch, iteration, len(loader), loss.item(), psnr))


def main():
    opt = parser.parse_args()
    print(opt)
    random.seed(opt.seed)
    torch.manual_seed(opt.seed)

    print("===> Loading datasets")
    loader = DataLoader(LapPyramidPatches(opt.patches, opt.seed), batch_size=opt.batchSize, shuffle=True)

    print("===> Building model")
    model = Net()
    criterion = L1_Charbonnier_loss()

    print("===> Setting Optimizer")
    optimizer = optim.SGD(model.parameters(), lr=opt.lr, momentum=opt.momentum,
                          weight_decay=opt.weight_decay)

    print("===> Training")
    for epoch in range(1, opt.nEpochs + 1):
        train(loader, optimizer, model, criterion, epoch, opt)


if __name__ == "__main__":
    main()
