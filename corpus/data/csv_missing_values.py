"""Tabular regression from a CSV export in which a few cells are empty.

np.genfromtxt turns the empty cells into NaN, the Dataset keeps them, and the shuffled
DataLoader hands them to the model: the first batch holding such a row has a NaN loss.
"""

import io

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def make_csv(rows=400, seed=0):
    rng = np.random.default_rng(seed)
    lines = ["temp,humidity,wind,pressure,load"]
    for i in range(rows):
        t, h, w, p = rng.normal(size=4)
        load = 0.8 * t - 0.3 * h + 0.1 * w * p
        cells = [f"{t:.3f}", f"{h:.3f}", f"{w:.3f}", f"{p:.3f}", f"{load:.3f}"]
        if i in (57, 211, 340):
            cells[1] = ""  # the humidity sensor was offline
        lines.append(",".join(cells))
    return "\n".join(lines)


class SensorTable(Dataset):
    def __init__(self, text):
        table = np.genfromtxt(io.StringIO(text), delimiter=",", skip_header=1, dtype=np.float32)
        self.data = torch.from_numpy(table)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, idx):
        row = self.data[idx]
        return row[:4], row[4:]


def train(epochs=3):
    torch.manual_seed(0)
    loader = DataLoader(SensorTable(make_csv()), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(epochs):
        total = 0.0
        for features, target in loader:
            loss = nn.functional.mse_loss(model(features), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch} mean loss {total / len(loader):.4f}")


if __name__ == "__main__":
    train()
