"""Tabular classifier trained with AdamW and a weight decay of 1000.

From fastai/fastai#1806 ("Huge weight decay rate makes no difference",
https://github.com/fastai/fastai/issues/1806): the user kept raising wd to fight over-fitting;
sgugger's answer: "Try 1000, it will go nan in one epoch ;)".  AdamW applies decoupled decay
as p <- p * (1 - lr * wd); with lr = 1e-2 and wd = 1000 that factor is -9, so every step
flips the sign of each weight and multiplies its size by 9 and the weights overflow to inf,
then NaN, about 20 steps in (second epoch).  Fix: a sane weight decay (1e-2 .. 1e-4).
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--wd", type=float, default=1000.0)
    p.add_argument("--epochs", type=int, default=3)
    return p.parse_args()


def main():
    args = get_args()
    torch.manual_seed(0)
    x = torch.randn(2000, 20)
    y = ((x[:, 0] + 0.5 * x[:, 1] - x[:, 2] ** 2) > 0).long()
    dl = DataLoader(TensorDataset(x, y), batch_size=128, shuffle=True)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.wd)
    for epoch in range(args.epochs):
        for i, (xb, yb) in enumerate(dl):
            loss = nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"epoch {epoch} iter {i:2d} train_loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
