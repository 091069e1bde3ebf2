"""Image inpainting with partial convolutions (Liu et al. 2018), trained with AMP.

A small encoder-decoder of PartialConv2d layers fills rectangular holes in 32x32
synthetic texture images. The loss is the usual valid/hole L1 pair. Mixed precision
(float16 autocast + GradScaler) is on by default to speed up training.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class PartialConv2d(nn.Conv2d):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("weight_mask_updater",
                             torch.ones(1, 1, self.kernel_size[0], self.kernel_size[1]),
                             persistent=False)
        self.slide_winsize = self.kernel_size[0] * self.kernel_size[1]

    def forward(self, x, mask):
        with torch.no_grad():
            update_mask = F.conv2d(mask, self.weight_mask_updater, bias=None, stride=self.stride,
                                   padding=self.padding, dilation=self.dilation)
            mask_ratio = self.slide_winsize / (update_mask + 1e-8)
            update_mask = torch.clamp(update_mask, 0, 1)
            mask_ratio = mask_ratio * update_mask
        raw_out = super().forward(x * mask)
        bias = self.bias.view(1, -1, 1, 1)
        out = (raw_out - bias) * mask_ratio + bias
        out = out * update_mask
        return out, update_mask


class InpaintNet(nn.Module):
    def __init__(self, ch=16):
        super().__init__()
        self.enc1 = PartialConv2d(3, ch, 7, stride=2, padding=3)
        self.enc2 = PartialConv2d(ch, ch * 2, 5, stride=2, padding=2)
        self.enc3 = PartialConv2d(ch * 2, ch * 2, 3, stride=2, padding=1)
        self.dec3 = PartialConv2d(ch * 4, ch * 2, 3, padding=1)
        self.dec2 = PartialConv2d(ch * 3, ch, 3, padding=1)
        self.dec1 = PartialConv2d(ch + 3, 3, 3, padding=1)

    def forward(self, img, mask):
        m0 = mask.expand(-1, 1, -1, -1)
        h1, m1 = self.enc1(img, m0)
        h1 = F.relu(h1)
        h2, m2 = self.enc2(h1, m1)
        h2 = F.relu(h2)
        h3, m3 = self.enc3(h2, m2)
        h3 = F.relu(h3)

        up = lambda t: F.interpolate(t, scale_factor=2, mode="nearest")
        d, dm = self.dec3(torch.cat([up(h3), h2], 1), torch.max(up(m3), m2))
        d = F.leaky_relu(d, 0.2)
        d, dm = self.dec2(torch.cat([up(d), h1], 1), torch.max(up(dm), m1))
        d = F.leaky_relu(d, 0.2)
        d, _ = self.dec1(torch.cat([up(d), img], 1), torch.max(up(dm), m0))
        return torch.sigmoid(d)


class TextureDataset(Dataset):
    def __init__(self, n=256, size=32, seed=0):
        g = torch.Generator().manual_seed(seed)
        yy, xx = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
        freqs = torch.rand(n, 3, 2, generator=g) * 12 + 2
        phase = torch.rand(n, 3, generator=g) * 2 * math.pi
        self.images = 0.5 + 0.5 * torch.sin(freqs[..., 0, None, None] * xx
                                            + freqs[..., 1, None, None] * yy
                                            + phase[..., None, None])
        self.masks = torch.ones(n, 1, size, size)
        for i in range(n):
            h, w = torch.randint(4, 15, (2,), generator=g).tolist()
            top = torch.randint(0, size - h, (1,), generator=g).item()
            left = torch.randint(0, size - w, (1,), generator=g).item()
            self.masks[i, :, top:top + h, left:left + w] = 0.0

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.masks[i]


def inpainting_loss(pred, target, mask):
    valid = F.l1_loss(pred * mask, target * mask)
    hole = F.l1_loss(pred * (1 - mask), target * (1 - mask))
    return valid + 6.0 * hole


def train(args):
    torch.manual_seed(0)
    loader = DataLoader(TextureDataset(), batch_size=16, shuffle=True)
    model = InpaintNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler("cpu", enabled=args.amp)

    step = 0
    for epoch in range(args.epochs):
        for img, mask in loader:
            with torch.autocast("cpu", dtype=torch.float16, enabled=args.amp):
                pred = model(img * mask, mask)
                loss = inpainting_loss(pred.float(), img, mask)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if step % 2 == 0:
                print(f"epoch {epoch} step {step:3d} loss {loss.item():.4f} "
                      f"scale {scaler.get_scale() if args.amp else 1.0:.0f}")
            step += 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--no-amp", dest="amp", action="store_false")
    train(parser.parse_args())


if __name__ == "__main__":
    main()
