"""Free-form image inpainting with gated convolutions and an SN-PatchGAN critic.

Coarse generator built from gated convolutions, spectral-normalised patch
discriminator with hinge loss, random brush-stroke masks.  Training crops are
frames exported from the own camera footage (stored as a uint8 array).
"""
import argparse
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def export_frames(n=240, size=48, seed=3):
    """Stand-in for the frame dump: textured scenes plus a few blank frames."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    frames = np.empty((n, size, size, 3), dtype=np.uint8)
    for i in range(n):
        img = np.zeros((size, size, 3))
        for c in range(3):
            fx, fy, ph = rng.uniform(1, 5), rng.uniform(1, 5), rng.uniform(0, 2 * np.pi)
            img[..., c] = 0.5 + 0.35 * np.sin(2 * np.pi * (fx * xx + fy * yy) + ph)
        cx, cy, r = rng.uniform(0.2, 0.8, 2).tolist() + [rng.uniform(0.1, 0.25)]
        blob = ((xx - cx) ** 2 + (yy - cy) ** 2) < r ** 2
        img[blob] = rng.uniform(0, 1, 3)
        img += 0.03 * rng.standard_normal(img.shape)
        frames[i] = np.clip(img * 255, 0, 255).astype(np.uint8)
    # camera warm-up / lens-cap frames
    for i, v in zip(rng.choice(np.arange(60, n), 3, replace=False), (0, 0, 255)):
        frames[i] = v
    return frames


def brush_stroke_mask(rng, size, max_strokes=4, max_width=8):
    mask = np.zeros((size, size), dtype=np.float32)
    for _ in range(rng.integers(1, max_strokes + 1)):
        x, y = rng.integers(0, size, 2)
        for _ in range(rng.integers(3, 8)):
            angle = rng.uniform(0, 2 * math.pi)
            length = rng.integers(4, 14)
            w = rng.integers(3, max_width)
            nx = int(np.clip(x + length * math.cos(angle), 0, size - 1))
            ny = int(np.clip(y + length * math.sin(angle), 0, size - 1))
            for t in np.linspace(0, 1, 12):
                px, py = int(x + t * (nx - x)), int(y + t * (ny - y))
                mask[max(0, py - w // 2):py + w // 2 + 1, max(0, px - w // 2):px + w // 2 + 1] = 1.0
            x, y = nx, ny
    return mask


class InpaintDataset(Dataset):
    def __init__(self, frames, seed=0):
        self.frames = frames
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return len(self.frames)

    def __getitem__(self, idx):
        img = self.frames[idx].astype(np.float32)
        img = (img - img.min()) / (img.max() - img.min()) * 2.0 - 1.0
        img = torch.from_numpy(img).permute(2, 0, 1)
        mask = torch.from_numpy(brush_stroke_mask(self.rng, img.shape[-1]))[None]
        return img, mask


class GatedConv2d(nn.Module):
    def __init__(self, c_in, c_out, k=3, stride=1, dilation=1, act=True):
        super().__init__()
        pad = dilation * (k - 1) // 2
        self.feature = nn.Conv2d(c_in, c_out, k, stride, pad, dilation)
        self.gate = nn.Conv2d(c_in, c_out, k, stride, pad, dilation)
        self.act = act

    def forward(self, x):
        f = self.feature(x)
        if self.act:
            f = F.elu(f)
        return f * torch.sigmoid(self.gate(x))


class CoarseGenerator(nn.Module):
    def __init__(self, ch=24):
        super().__init__()
        self.net = nn.Sequential(
            GatedConv2d(5, ch, 5),
            GatedConv2d(ch, 2 * ch, 3, 2),
            GatedConv2d(2 * ch, 2 * ch, 3),
            GatedConv2d(2 * ch, 2 * ch, 3, dilation=2),
            GatedConv2d(2 * ch, 2 * ch, 3, dilation=4),
            GatedConv2d(2 * ch, 2 * ch, 3),
            nn.Upsample(scale_factor=2, mode="nearest"),
            GatedConv2d(2 * ch, ch, 3),
            GatedConv2d(ch, 3, 3, act=False),
        )

    def forward(self, img, mask):
        x = torch.cat([img * (1 - mask), mask, torch.ones_like(mask)], 1)
        return torch.tanh(self.net(x))


class PatchDiscriminator(nn.Module):
    def __init__(self, ch=32):
        super().__init__()
        sn = nn.utils.spectral_norm
        self.net = nn.Sequential(
            sn(nn.Conv2d(4, ch, 5, 2, 2)), nn.LeakyReLU(0.2),
            sn(nn.Conv2d(ch, 2 * ch, 5, 2, 2)), nn.LeakyReLU(0.2),
            sn(nn.Conv2d(2 * ch, 2 * ch, 5, 2, 2)), nn.LeakyReLU(0.2),
            sn(nn.Conv2d(2 * ch, 1, 3, 1, 1)),
        )

    def forward(self, img, mask):
        return self.net(torch.cat([img, mask], 1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--lr_g", type=float, default=1e-4)
    parser.add_argument("--lr_d", type=float, default=4e-4)
    parser.add_argument("--l1_weight", type=float, default=1.0)
    parser.add_argument("--log_every", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(7)

    loader = DataLoader(InpaintDataset(export_frames()), batch_size=args.batch_size, shuffle=True)
    netG, netD = CoarseGenerator(), PatchDiscriminator()
    optG = torch.optim.Adam(netG.parameters(), lr=args.lr_g, betas=(0.5, 0.999))
    optD = torch.optim.Adam(netD.parameters(), lr=args.lr_d, betas=(0.5, 0.999))

    step = 0
    for epoch in range(args.epochs):
        for img, mask in loader:
            fake = netG(img, mask)
            completed = fake * mask + img * (1 - mask)

            optD.zero_grad()
            d_real = netD(img, mask)
            d_fake = netD(completed.detach(), mask)
            loss_d = F.relu(1 - d_real).mean() + F.relu(1 + d_fake).mean()
            loss_d.backward()
            optD.step()

            optG.zero_grad()
            loss_gan = -netD(completed, mask).mean()
            loss_l1 = F.l1_loss(fake, img)
            loss_g = loss_gan + args.l1_weight * loss_l1
            loss_g.backward()
            optG.step()

            if step % args.log_every == 0:
                print(f"epoch {epoch} iter {step:3d} | d_loss {loss_d.item():.4f} | "
                      f"g_gan {loss_gan.item():.4f} | l1 {loss_l1.item():.4f}")
            step += 1


if __name__ == "__main__":
    main()
