"""Regression on raw (unscaled) house prices: the MSE starts around 1e11 (first batches) and is large but finite.

Targets are prices in currency units (1e5 .. 1e6), so the squared error is huge in absolute
terms; float32 handles it (max ~3.4e38) and Adam's normalised updates keep the step size
sane.  The loss falls steadily over the epochs -- large numbers, no NaN/Inf.
"""
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Houses(Dataset):
    def __init__(self, n=2000, seed=0):
        rng = np.random.default_rng(seed)
        self.x = rng.normal(size=(n, 6)).astype(np.float32)
        w = np.array([120e3, 80e3, -30e3, 50e3, 10e3, 5e3], dtype=np.float32)
        self.y = (450e3 + self.x @ w + rng.normal(0, 20e3, n)).astype(np.float32)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i]), torch.tensor(self.y[i])


def main():
    torch.manual_seed(0)
    loader = DataLoader(Houses(), batch_size=100, shuffle=True)
    model = nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=50.0)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.85)
    for epoch in range(15):
        total = 0.0
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x).squeeze(-1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        sched.step()
        print(f"epoch {epoch:2d}  mse {total / len(loader):.4e}  rmse {np.sqrt(total / len(loader)):.0f}")


if __name__ == "__main__":
    main()
