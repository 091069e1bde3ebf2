"""Tabular regression where one continuous column is constant in the training split.

Reported in fastai/fastai#889 ("Normalization for tabulardata produces nan for constant
columns", https://github.com/fastai/fastai/issues/889): the tabular preprocessing computes
per-column means and stds and does (x - mean) / std.  A column that happens to be constant
in the data (a controlled temperature that is always 20.0 here) has std == 0, so the whole
column becomes 0/0 = NaN and every forward pass is NaN from the first batch on.

Fix (as proposed in the issue): only divide the columns whose std is non-zero (or set the
std of constant columns to 1) when normalising the continuous features.
"""
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(0)
rng = np.random.default_rng(0)


def make_frame(n=512):
    pressure = rng.normal(1.0, 0.05, n)
    flow = rng.uniform(0.5, 2.0, n)
    temperature = np.full(n, 20.0)          # controlled environment: never changes
    humidity = rng.normal(0.4, 0.1, n)
    conts = np.stack([pressure, flow, temperature, humidity], axis=1).astype(np.float32)
    target = (3.0 * pressure - 1.5 * flow + 0.8 * humidity + rng.normal(0, 0.05, n)).astype(np.float32)
    return conts, target


class TabularDataset(Dataset):
    def __init__(self, conts, target):
        means = conts.mean(axis=0)
        stds = conts.std(axis=0)
        self.conts = (conts - means[None]) / stds[None]
        self.target = target

    def __len__(self):
        return len(self.target)

    def __getitem__(self, i):
        return torch.from_numpy(self.conts[i]), torch.tensor(self.target[i])


class TabularModel(nn.Module):
    def __init__(self, n_cont, hidden=32):
        super().__init__()
        self.bn = nn.BatchNorm1d(n_cont)
        self.layers = nn.Sequential(nn.Linear(n_cont, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.layers(self.bn(x)).squeeze(-1)


def main():
    conts, target = make_frame()
    ds = TabularDataset(conts, target)
    dl = DataLoader(ds, batch_size=64, shuffle=True)
    model = TabularModel(conts.shape[1])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for epoch in range(3):
        for i, (xb, yb) in enumerate(dl):
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"epoch {epoch} batch {i} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
