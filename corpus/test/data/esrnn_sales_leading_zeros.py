"""ES-RNN style daily sales forecaster (M5-like store/item panel).

Each series is de-levelled with simple exponential smoothing (multiplicative
model, as in Smyl's ES-RNN): an input window is divided by the level at its last
step and log-transformed, and an LSTM predicts the log ratio of the next week.
"""
import argparse

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


def make_sales_panel(n_series=150, n_days=210, seed=7):
    rng = np.random.default_rng(seed)
    t = np.arange(n_days)
    base = rng.uniform(20.0, 80.0, size=(n_series, 1))
    phase = rng.uniform(0.0, 2 * np.pi, size=(n_series, 1))
    weekly = 1.0 + 0.3 * np.sin(2 * np.pi * t / 7.0 + phase)
    growth = 1.0 + rng.uniform(-0.001, 0.003, size=(n_series, 1)) * t
    sales = rng.poisson(base * weekly * growth).astype(np.float64)
    # a few items entered the catalogue after the panel starts
    for item in rng.choice(n_series, size=1, replace=False):
        sales[item, : rng.integers(2, 5)] = 0.0
    return sales


def es_levels(y, alpha):
    level = np.empty_like(y)
    level[:, 0] = y[:, 0]
    for t in range(1, y.shape[1]):
        level[:, t] = alpha * y[:, t] + (1.0 - alpha) * level[:, t - 1]
    return level


class ESWindowDataset(Dataset):
    def __init__(self, sales, input_size=14, output_size=7, alpha=0.3):
        self.y = np.asarray(sales, dtype=np.float64)
        self.level = es_levels(self.y, alpha)
        self.input_size, self.output_size = input_size, output_size
        n_windows = self.y.shape[1] - input_size - output_size + 1
        self.index = [(s, w) for s in range(self.y.shape[0]) for w in range(n_windows)]

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        s, w = self.index[i]
        end = w + self.input_size
        lev = self.level[s, end - 1]
        x = np.log(self.y[s, w:end] / lev)
        y = np.log(self.y[s, end:end + self.output_size] / lev)
        return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)


class ResidualLSTM(nn.Module):
    def __init__(self, input_size, output_size, hidden=32):
        super().__init__()
        self.lstm = nn.LSTM(1, hidden, batch_first=True)
        self.head = nn.Sequential(nn.Linear(hidden + input_size, hidden), nn.Tanh(),
                                  nn.Linear(hidden, output_size))

    def forward(self, x):
        out, _ = self.lstm(x.unsqueeze(-1))
        return self.head(torch.cat([out[:, -1], x], dim=1))


def pinball_loss(y_hat, y, tau=0.5):
    diff = y - y_hat
    return torch.mean(torch.maximum(tau * diff, (tau - 1.0) * diff))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max-steps", type=int, default=220)
    args = parser.parse_args()

    torch.manual_seed(0)
    sales = make_sales_panel()
    train_ds = ESWindowDataset(sales)
    loader = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    model = ResidualLSTM(train_ds.input_size, train_ds.output_size)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    step = 0
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = pinball_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 20.0)
            opt.step()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step:4d} pinball {loss.item():.5f}")
            step += 1
            if step >= args.max_steps:
                return


if __name__ == "__main__":
    main()
