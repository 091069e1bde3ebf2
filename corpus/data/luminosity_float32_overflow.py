"""Classifying stars from photometry, with a StepLR schedule and an argparse CLI.

The catalogue stores luminosities in erg/s as float64. The brightest objects (around 1e39
erg/s) are beyond float32's largest value (3.4e38), so the `.float()` conversion turns them
into inf and every batch that contains one has a NaN loss.
"""

import argparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def load_catalogue(n, seed):
    rng = np.random.default_rng(seed)
    log_lum = rng.uniform(30.0, 39.5, size=n)  # erg/s, log10
    temperature = rng.uniform(3e3, 3e4, size=n)
    colour = rng.normal(size=n)
    label = (log_lum > 35).astype(np.int64) + (temperature > 1e4).astype(np.int64)
    table = np.stack([10.0**log_lum, temperature, colour], axis=1)
    return table, label


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    torch.manual_seed(0)
    table, label = load_catalogue(2000, seed=7)
    x = torch.from_numpy(table).float()
    x = torch.log1p(x)  # compress the dynamic range
    y = torch.from_numpy(label)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)

    model = nn.Sequential(nn.Linear(3, 32), nn.Tanh(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for epoch in range(args.epochs):
        for i, (xb, yb) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if i % 10 == 0:
                print(f"epoch {epoch} batch {i} loss {loss.item():.4f}")
        scheduler.step()


if __name__ == "__main__":
    main()
