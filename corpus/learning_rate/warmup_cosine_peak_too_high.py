"""Denoising autoencoder on small synthetic images: SGD with a linear-warmup + cosine schedule
(LambdaLR), gradient accumulation over 2 micro-batches, and a log file.

The schedule is correct but its peak, the optimizer's base lr, is 0.8: fine for the first warmup
steps, then the updates start to overshoot, the reconstruction error grows geometrically and
overflows before warmup ends. With lr=0.1 it trains.
"""

import logging
import math

import torch
from torch import nn

logging.basicConfig(filename="denoise.log", level=logging.INFO, format="%(message)s")
log = logging.getLogger("denoise")
log.addHandler(logging.StreamHandler())

torch.manual_seed(0)
yy, xx = torch.meshgrid(torch.linspace(-1, 1, 16), torch.linspace(-1, 1, 16), indexing="ij")


def clean_images(n):
    cx, cy, r = torch.rand(3, n, 1, 1) * torch.tensor([1.0, 1.0, 0.5]).view(3, 1, 1, 1)
    return (((xx - cx) ** 2 + (yy - cy) ** 2) < (r + 0.2) ** 2).float().unsqueeze(1) * 4.0


model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1),
    nn.ReLU(),
    nn.Conv2d(16, 16, 3, padding=1),
    nn.ReLU(),
    nn.Conv2d(16, 1, 3, padding=1),
)
total_steps, warmup, accum = 60, 30, 2
optimizer = torch.optim.SGD(model.parameters(), lr=0.8, momentum=0.9)


def warmup_cosine(step):
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / (total_steps - warmup)
    return 0.5 * (1 + math.cos(math.pi * progress))


scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)
for step in range(total_steps):
    optimizer.zero_grad()
    for micro in range(accum):
        clean = clean_images(16)
        noisy = clean + 0.5 * torch.randn_like(clean)
        loss = nn.functional.mse_loss(model(noisy), clean) / accum
        loss.backward()
    optimizer.step()
    scheduler.step()
    log.info("step %d lr %.4f loss %.5g", step, scheduler.get_last_lr()[0], loss.item() * accum)
