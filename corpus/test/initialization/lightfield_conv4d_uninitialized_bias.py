"""Light-field denoising with a home-made 4D convolution (convNd-style Conv4d).

A 4D light field L(u, v, y, x) (3x3 angular views of 8x8 pixels) is denoised by a small
stack of 4D convolutions.  PyTorch has no Conv4d, so - like pvjosue/pytorch_convNd - the
layer is built from one Conv3d per tap of the first (u) kernel dimension, the 3D results
are summed over the shifted u slices, and one bias per output channel is added at the end.
The bias tensor is allocated with nn.Parameter(torch.Tensor(out_channels)) and only filled
when a bias_initializer is passed; the training script sets
torch.use_deterministic_algorithms(True) for reproducible runs.

Report: https://github.com/pvjosue/pytorch_convNd/pull/6 (issue #4 "Getting NaNs... manual
initialization required?": a UNet built from convNd gave all-NaN outputs unless the
initializers were set by hand; the merged fix allocates the bias with torch.zeros).
"""
import argparse
import math
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)


class Conv4d(nn.Module):
    """4D convolution over (u, v, y, x) as a sum of 3D convolutions along u."""

    def __init__(self, in_channels, out_channels, kernel_size=3, padding=1,
                 use_bias=True, kernel_initializer=None, bias_initializer=None):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = (kernel_size,) * 4
        self.padding = padding
        if use_bias:
            self.bias = nn.Parameter(torch.Tensor(out_channels))
        else:
            self.register_parameter("bias", None)
        if kernel_initializer is None:
            fan_in = in_channels * kernel_size ** 4
            bound = 1.0 / math.sqrt(fan_in)
            kernel_initializer = lambda w: nn.init.uniform_(w, -bound, bound)
        if bias_initializer is not None and self.bias is not None:
            bias_initializer(self.bias)
        # one Conv3d per tap along u; only the top-level module carries a bias
        self.conv_layers = nn.ModuleList()
        for _ in range(kernel_size):
            layer = nn.Conv3d(in_channels, out_channels, kernel_size, padding=padding, bias=False)
            kernel_initializer(layer.weight)
            self.conv_layers.append(layer)

    def forward(self, x):
        # x: (B, C, U, V, H, W)
        b, c, u, v, h, w = x.shape
        k = self.kernel_size[0]
        x = F.pad(x.reshape(b, c, u, -1), (0, 0, self.padding, self.padding)).reshape(
            b, c, u + 2 * self.padding, v, h, w)
        u_out = u + 2 * self.padding - k + 1
        out = None
        for i, conv in enumerate(self.conv_layers):
            # all u positions for tap i at once: fold u into the batch dimension
            sl = x[:, :, i:i + u_out].permute(0, 2, 1, 3, 4, 5).reshape(b * u_out, c, v, h, w)
            y = conv(sl)
            out = y if out is None else out + y
        out = out.reshape(b, u_out, self.out_channels, *out.shape[-3:]).permute(0, 2, 1, 3, 4, 5)
        if self.bias is not None:
            out = out + self.bias.view(1, -1, 1, 1, 1, 1)
        return out


class LightFieldDenoiser(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.body = nn.ModuleList([
            Conv4d(1, width),
            Conv4d(width, width),
            Conv4d(width, 1),
        ])

    def forward(self, noisy):
        x = noisy
        for i, layer in enumerate(self.body):
            x = layer(x)
            if i < len(self.body) - 1:
                x = F.relu(x)
        return noisy - x  # predict the noise residual


class SyntheticLightFields(Dataset):
    """Fronto-parallel textured planes seen from a 3x3 camera grid, plus Gaussian noise."""

    def __init__(self, n, angular=3, size=8, sigma=0.2, seed=0):
        rng = np.random.RandomState(seed)
        self.clean, self.noisy = [], []
        yy, xx = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
        for _ in range(n):
            disparity = rng.uniform(-1.0, 1.0)
            fx, fy = rng.uniform(0.2, 0.9, size=2)
            phase = rng.uniform(0, 2 * np.pi)
            lf = np.zeros((angular, angular, size, size), np.float32)
            for u in range(angular):
                for v in range(angular):
                    du = (u - angular // 2) * disparity
                    dv = (v - angular // 2) * disparity
                    lf[u, v] = 0.5 + 0.4 * np.sin(fx * (xx + dv) + fy * (yy + du) + phase)
            self.clean.append(lf)
            self.noisy.append(lf + sigma * rng.randn(*lf.shape).astype(np.float32))

    def __len__(self):
        return len(self.clean)

    def __getitem__(self, i):
        return torch.from_numpy(self.noisy[i])[None], torch.from_numpy(self.clean[i])[None]


def psnr(mse):
    if not math.isfinite(mse):
        return float("nan")
    return 10.0 * math.log10(1.0 / mse) if mse > 0 else float("inf")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    seed_everything(args.seed)
    loader = DataLoader(SyntheticLightFields(32, seed=args.seed), batch_size=args.batch_size,
                        shuffle=True)
    model = LightFieldDenoiser()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    step = 0
    for epoch in range(args.epochs):
        for noisy, clean in loader:
            denoised = model(noisy)
            loss = F.mse_loss(denoised, clean)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 4 == 0:
                print(f"epoch {epoch} step {step:3d}  mse {loss.item():.6f}  psnr {psnr(loss.item()):.2f} dB")
            step += 1


if __name__ == "__main__":
    main()
