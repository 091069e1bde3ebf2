"""Planted bug: a UCR-style archive stores sensor outages as the "NaN" token; `np.loadtxt` in
the script's reader parses them into NaN, and the arrays reach a `TensorDataset` built inside a
training function from module-level variables. The line to fix is the reader's parse."""

import os
import tempfile

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset


def write_archive(path, rng):
    series = rng.normal(size=(160, 24))
    series[[37, 111], 5:9] = 1e30  # placeholder, rewritten as the outage token below
    with open(path, "w") as file:
        for label, row in zip(rng.integers(0, 3, size=160), series, strict=True):
            fields = ["NaN" if v == 1e30 else f"{v:.4f}" for v in row]
            file.write("\t".join([str(label), *fields]) + "\n")


def read_archive(path):
    data = np.loadtxt(path, delimiter="\t")  # made here
    return data[:, 1:], data[:, 0].astype(np.int64)


def train():
    dataset = TensorDataset(torch.tensor(x_train, dtype=torch.float32), torch.from_numpy(y_train))
    loader = DataLoader(
        dataset, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        for xb, yb in loader:
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


archive = os.path.join(tempfile.mkdtemp(), "train.tsv")
write_archive(archive, np.random.default_rng(0))
x_train, y_train = read_archive(archive)
train()
