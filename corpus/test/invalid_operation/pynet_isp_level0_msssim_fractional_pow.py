"""PyNET-style learned camera ISP (packed Bayer RAW -> RGB), trained level by level.

Setting: the PyNET recipe (Ignatov et al.) shrunk to two levels.  Level 1 works at the
packed-RAW resolution and is trained first with an MSE loss; its weights are saved and
restored (strict=False) into the level-0 model, which adds an upsampling head producing the
full-resolution RGB image and trains with MSE + 0.4 * (1 - MS-SSIM).  msssim.py is the copy
PyNET vendored from jorge-pessoa/pytorch-msssim: per scale it takes the mean SSIM and the
mean contrast-structure term cs, and combines them as prod(mcs ** weights) with fractional
weights (0.0448 ... 0.1333).

Bug: cs (and SSIM) is a correlation-like quantity and can be negative; a negative base
raised to a fractional power is NaN.  The level-0 head is new, so its first outputs are
poorly (at some scales anti-) correlated with the DSLR target: at the first level-0
iteration (after 36 clean level-1 iterations) cs is about -0.07 at two scales and the
coarsest SSIM about -0.01, so MS-SSIM, the loss and all gradients are NaN, Adam writes NaN
into the weights and every later loss is nan.

Fix (maintainer of pytorch-msssim, commit 6cd7eec, "Changed normalize to support relu";
README: use normalize="relu" when training): rectify each scale before the powers,
    mssim.append(torch.relu(sim)); mcs.append(torch.relu(cs))
(here equivalently on the stacked values: torch.relu(torch.stack(mssim)), ...).
Report: https://github.com/jorge-pessoa/pytorch-msssim/issues/2 ("Arbitrary NAN for very low
MS-SSIM comparisons", labelled bug), hit by PyNET users in
https://github.com/aiff22/PyNET-PyTorch/issues/7 ("when level1 and level0, the MS-SSIM loss
be Nan ... the SSIM could be negative").
"""
import os
import sys
import tempfile
from math import exp

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import Adam
from torch.utils.data import DataLoader, Dataset

np.random.seed(1)
torch.manual_seed(1)


# ----------------------------------------------------------------------------- msssim.py
def gaussian(window_size, sigma):
    gauss = torch.Tensor([exp(-(x - window_size // 2) ** 2 / float(2 * sigma ** 2)) for x in range(window_size)])
    return gauss / gauss.sum()


def create_window(window_size, channel=1):
    _1D_window = gaussian(window_size, 1.5).unsqueeze(1)
    _2D_window = _1D_window.mm(_1D_window.t()).float().unsqueeze(0).unsqueeze(0)
    return _2D_window.expand(channel, 1, window_size, window_size).contiguous()


def ssim(img1, img2, window_size=11, size_average=True, full=False, val_range=1.0):
    (_, channel, height, width) = img1.size()
    real_size = min(window_size, height, width)
    window = create_window(real_size, channel=channel).to(img1.device)
    mu1 = F.conv2d(img1, window, groups=channel)
    mu2 = F.conv2d(img2, window, groups=channel)
    mu1_sq, mu2_sq, mu1_mu2 = mu1.pow(2), mu2.pow(2), mu1 * mu2
    sigma1_sq = F.conv2d(img1 * img1, window, groups=channel) - mu1_sq
    sigma2_sq = F.conv2d(img2 * img2, window, groups=channel) - mu2_sq
    sigma12 = F.conv2d(img1 * img2, window, groups=channel) - mu1_mu2
    C1, C2 = (0.01 * val_range) ** 2, (0.03 * val_range) ** 2
    v1 = 2.0 * sigma12 + C2
    v2 = sigma1_sq + sigma2_sq + C2
    cs = torch.mean(v1 / v2)
    ssim_map = ((2 * mu1_mu2 + C1) * v1) / ((mu1_sq + mu2_sq + C1) * v2)
    ret = ssim_map.mean() if size_average else ssim_map.mean(1).mean(1).mean(1)
    return (ret, cs) if full else ret


def msssim(img1, img2, window_size=11, size_average=True, val_range=1.0):
    weights = torch.FloatTensor([0.0448, 0.2856, 0.3001, 0.2363, 0.1333]).to(img1.device)
    mssim, mcs = [], []
    for _ in range(weights.size(0)):
        sim, cs = ssim(img1, img2, window_size=window_size, size_average=size_average, full=True,
                       val_range=val_range)
        mssim.append(sim)
        mcs.append(cs)
        img1 = F.avg_pool2d(img1, (2, 2))
        img2 = F.avg_pool2d(img2, (2, 2))
    mssim, mcs = torch.stack(mssim), torch.stack(mcs)
    pow1 = mcs ** weights
    pow2 = mssim ** weights
    return torch.prod(pow1[:-1]) * pow2[-1]


class MSSSIM(nn.Module):
    def forward(self, img1, img2):
        return msssim(img1, img2)


# ---------------------------------------------------------------------------- load_data.py
class LoadData(Dataset):
    """Synthetic Zurich-RAW-to-DSLR pairs: packed RGGB RAW (4 x 32 x 32) and DSLR RGB (3 x 64 x 64)."""

    def __init__(self, n, dslr_scale, seed):
        rng = np.random.RandomState(seed)
        self.raw, self.dslr = [], []
        yy, xx = np.mgrid[0:64, 0:64] / 64.0
        for _ in range(n):
            img = np.zeros((3, 64, 64))
            for c in range(3):
                fx, fy, ph = rng.uniform(0.5, 3.0), rng.uniform(0.5, 3.0), rng.uniform(0, 6.3)
                img[c] = 0.5 + 0.25 * np.sin(2 * np.pi * (fx * xx + fy * yy) + ph)
            for _ in range(rng.randint(2, 5)):
                x0, y0 = rng.randint(0, 48, 2)
                s = rng.randint(6, 16)
                img[:, y0:y0 + s, x0:x0 + s] = rng.uniform(0.05, 0.95, (3, 1, 1))
            dslr = np.clip(img, 0, 1)
            linear = dslr ** 2.2 * np.array([0.45, 1.0, 0.7])[:, None, None]   # sensor response
            raw = np.stack([linear[0, 0::2, 0::2], linear[1, 0::2, 1::2],
                            linear[1, 1::2, 0::2], linear[2, 1::2, 1::2]])
            raw = raw + rng.normal(0, 0.01, raw.shape)
            self.raw.append(torch.from_numpy(raw).float())
            dslr = torch.from_numpy(dslr).float()
            if dslr_scale != 1:
                dslr = F.interpolate(dslr[None], scale_factor=dslr_scale, mode="bilinear",
                                     align_corners=False)[0]
            self.dslr.append(dslr)

    def __len__(self):
        return len(self.raw)

    def __getitem__(self, idx):
        return self.raw[idx], self.dslr[idx]


# -------------------------------------------------------------------------------- model.py
class ConvMultiBlock(nn.Module):
    def __init__(self, in_channels, out_channels, max_conv_size, instance_norm):
        super().__init__()
        self.conv_3a = ConvLayer(in_channels, out_channels, 3, instance_norm=instance_norm)
        self.conv_3b = ConvLayer(out_channels, out_channels, 3, instance_norm=instance_norm)
        self.max_conv_size = max_conv_size

    def forward(self, x):
        return self.conv_3b(self.conv_3a(x))


class ConvLayer(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, relu=True, instance_norm=False):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2,
                                padding_mode="reflect")
        self.instance = nn.InstanceNorm2d(out_channels, affine=True) if instance_norm else None
        self.relu = nn.LeakyReLU(0.2) if relu else None

    def forward(self, x):
        out = self.conv2d(x)
        if self.instance is not None:
            out = self.instance(out)
        return self.relu(out) if self.relu is not None else out


class UpsampleConvLayer(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.relu = nn.LeakyReLU(0.2)

    def forward(self, x):
        return self.relu(self.conv2d(F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)))


class PyNET(nn.Module):
    def __init__(self, level, instance_norm=True):
        super().__init__()
        self.level = level
        self.conv_l1_d1 = ConvMultiBlock(4, 16, 3, instance_norm=False)
        self.pool1 = nn.MaxPool2d(2, 2)
        self.conv_l2_d1 = ConvMultiBlock(16, 32, 3, instance_norm=instance_norm)
        self.conv_t1a = UpsampleConvLayer(32, 16, 3)
        self.conv_l1_d2 = ConvMultiBlock(32, 16, 3, instance_norm=instance_norm)
        self.conv_l1_out = ConvLayer(16, 3, 3, relu=False)
        self.conv_t0 = UpsampleConvLayer(16, 16, 3)
        self.conv_l0_d1 = ConvLayer(16, 3, 3, relu=False)

    def forward(self, x):
        conv_l1_d1 = self.conv_l1_d1(x)
        conv_l2_d1 = self.conv_l2_d1(self.pool1(conv_l1_d1))
        conv_l1_d2 = self.conv_l1_d2(torch.cat([conv_l1_d1, self.conv_t1a(conv_l2_d1)], 1))
        if self.level == 1:
            return torch.tanh(self.conv_l1_out(conv_l1_d2)) * 0.58 + 0.5
        return torch.sigmoid(self.conv_l0_d1(self.conv_t0(conv_l1_d2)))


# -------------------------------------------------------------------------- train_model.py
def process_command_args(arguments):
    batch_size, learning_rate, num_train_epochs = 8, 5e-4, 3
    for args in arguments[1:]:
        if args.startswith("batch_size"):
            batch_size = int(args.split("=")[1])
        if args.startswith("learning_rate"):
            learning_rate = float(args.split("=")[1])
        if args.startswith("num_train_epochs"):
            num_train_epochs = int(args.split("=")[1])
    return batch_size, learning_rate, num_train_epochs


def train_model(level, batch_size, learning_rate, num_train_epochs, model_dir):
    dslr_scale = float(1) / (2 ** level)
    train_loader = DataLoader(LoadData(96, dslr_scale, seed=1), batch_size=batch_size, shuffle=True,
                              drop_last=True)
    generator = PyNET(level=level, instance_norm=True)
    optimizer = Adam(params=generator.parameters(), lr=learning_rate)
    if level < 1:
        generator.load_state_dict(torch.load(os.path.join(model_dir, "pynet_level_%d_epoch_%d.pth"
                                                          % (level + 1, num_train_epochs - 1))), strict=False)
    MSE_loss = torch.nn.MSELoss()
    MS_SSIM = MSSSIM()

    for epoch in range(num_train_epochs):
        for i, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            enhanced = generator(x)
            loss_mse = MSE_loss(enhanced, y)
            if level == 1:
                total_loss = loss_mse * 10
            if level == 0:
                loss_ssim = MS_SSIM(enhanced, y)
                total_loss = loss_mse + (1 - loss_ssim) * 0.4
            total_loss.backward()
            optimizer.step()
            if i % 4 == 0:
                msg = "level %d, epoch %d, iter %2d, loss: %.4f, mse: %.5f" % (
                    level, epoch, i, total_loss.item(), loss_mse.item())
                if level == 0:
                    msg += ", ms-ssim: %.4f" % loss_ssim.item()
                print(msg)
        torch.save(generator.state_dict(), os.path.join(model_dir, "pynet_level_%d_epoch_%d.pth" % (level, epoch)))


if __name__ == "__main__":
    batch_size, learning_rate, num_train_epochs = process_command_args(sys.argv)
    with tempfile.TemporaryDirectory() as model_dir:
        for level in (1, 0):
            train_model(level, batch_size, learning_rate, num_train_epochs, model_dir)
