"""Planted bug: a sensor export has two empty fields; `np.genfromtxt` reads them as NaN, a
scaler that ignores NaN when fitting keeps them, and the Dataset only serves rows of the
tensor it was given. The line to fix is the parse, not the Dataset that serves the rows."""

import os
import tempfile

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


def export_readings(path, rng):
    readings = rng.normal(size=(512, 6))
    readings[:, -1] = readings[:, :-1].sum(axis=1)
    with open(path, "w") as file:
        file.write("a,b,c,d,e,target\n")
        for i, row in enumerate(readings):
            fields = [f"{v:.4f}" for v in row]
            if i in (300, 301):
                fields[2] = ""  # the sensor dropped out
            file.write(",".join(fields) + "\n")


def load_readings(path):
    raw = np.genfromtxt(path, delimiter=",", skip_header=1)  # made here
    return raw[:, :-1], raw[:, -1:]


class Standardizer:
    def fit(self, x):
        self.mean, self.std = np.nanmean(x, axis=0), np.nanstd(x, axis=0)
        return self

    def transform(self, x):
        return (x - self.mean) / self.std


class Readings(Dataset):
    def __init__(self, features, targets):
        self.features = torch.tensor(features, dtype=torch.float32)
        self.targets = torch.tensor(targets, dtype=torch.float32)

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.features[i], self.targets[i]


def main():
    rng = np.random.default_rng(0)
    path = os.path.join(tempfile.mkdtemp(), "readings.csv")
    export_readings(path, rng)
    features, targets = load_readings(path)
    scaler = Standardizer().fit(features)
    data = Readings(scaler.transform(features), targets)
    loader = DataLoader(
        data, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(2):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
