"""Planted bug: SGD(lr=0.8, momentum=0.9) on a small MLP regression diverges within a few steps."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.8)  # the line to fix
parser.add_argument("--steps", type=int, default=60)
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
x = torch.randn(256, 8)
y = x[:, :1] * 2.0 - x[:, 1:2] + 0.5 * x[:, 2:3] ** 2
for step in range(args.steps):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4g}")
