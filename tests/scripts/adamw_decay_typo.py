"""Planted bug: AdamW with weight_decay=2000 (meant 2e-3), from an argparse default: each step
multiplies every weight by 1 - lr x weight_decay = -19."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=1e-2)
parser.add_argument("--weight-decay", type=float, default=2000)
args = parser.parse_args()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
x = torch.randn(128, 8)
y = torch.randint(0, 3, (128,))
for step in range(40):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4g}")
