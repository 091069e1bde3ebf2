"""Healthy: a residual MLP regressor with an argparse CLI, gradient accumulation over
micro-batches, OneCycleLR stepped once per optimizer step, and a validation pass under
torch.no_grad()."""

import argparse

import torch
from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class ResMLP(nn.Module):
    def __init__(self, d_in, width=64, blocks=3):
        super().__init__()
        self.stem = nn.Linear(d_in, width)
        self.blocks = nn.Sequential(*[ResidualBlock(width) for _ in range(blocks)])
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--accum", type=int, default=4)
    parser.add_argument("--max-lr", type=float, default=3e-3)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(6000, 10)
    y = (x[:, :3].prod(dim=1) + torch.sin(x[:, 3]) + 0.1 * torch.randn(6000)).unsqueeze(1)
    x_val, y_val = x[5000:], y[5000:]
    model = ResMLP(10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.max_lr, weight_decay=1e-2)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.max_lr, total_steps=args.steps
    )
    for step in range(args.steps):
        optimizer.zero_grad()
        for _ in range(args.accum):
            idx = torch.randint(0, 5000, (args.micro_batch,))
            loss = nn.functional.mse_loss(model(x[idx]), y[idx]) / args.accum
            loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 10 == 9:
            with torch.no_grad():
                val = nn.functional.mse_loss(model(x_val), y_val)
            print(f"step {step} lr {scheduler.get_last_lr()[0]:.2e} val mse {val.item():.4f}")


if __name__ == "__main__":
    main()
