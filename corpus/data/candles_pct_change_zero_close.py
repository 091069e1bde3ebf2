"""Next-bar direction model on 1-minute futures candles.

Raw OHLCV bars are turned into stationary features (close-to-close percent change,
candle body and wick ratios, log volume), rows with missing values are dropped, and
an LSTM reads sliding windows of 32 bars in time order.
"""
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

WINDOW = 32
torch.manual_seed(0)


def fetch_candles(n_bars=4200, seed=11):
    rng = np.random.default_rng(seed)
    log_ret = rng.normal(0.0, 0.0015, n_bars) + 0.0004 * np.sin(np.arange(n_bars) / 40.0)
    close = 2450.0 * np.exp(np.cumsum(log_ret))
    open_ = np.r_[close[0], close[:-1]] * (1 + rng.normal(0, 2e-4, n_bars))
    high = np.maximum(open_, close) * (1 + np.abs(rng.normal(0, 6e-4, n_bars)))
    low = np.minimum(open_, close) * (1 - np.abs(rng.normal(0, 6e-4, n_bars)))
    volume = rng.lognormal(3.0, 0.5, n_bars)
    candles = np.stack([open_, high, low, close, volume], axis=1)
    missing = rng.choice(n_bars, size=6, replace=False)
    candles[missing, 4] = np.nan           # venue did not report the volume
    candles[3415, :4] = 0.0                # halted bar from the exchange feed
    return candles


def pct_change(x):
    out = np.full_like(x, np.nan)
    out[1:] = x[1:] / x[:-1] - 1.0
    return out


def preprocess(candles):
    o, h, l, c, v = candles.T
    with np.errstate(divide="ignore", invalid="ignore"):
        feats = np.stack([
            pct_change(c) * 100.0,
            (c - o) / c * 100.0,
            (h - np.maximum(o, c)) / c * 100.0,
            (np.minimum(o, c) - l) / c * 100.0,
            np.log1p(v) - 3.0,
        ], axis=1)
    target = np.r_[(c[1:] > c[:-1]).astype(np.float64), np.nan]
    table = np.column_stack([feats, target])
    table = table[~np.isnan(table).any(axis=1)]
    return table[:, :-1].astype(np.float32), table[:, -1].astype(np.float32)


def make_windows(feats, target):
    idx = np.arange(WINDOW, len(feats))
    x = np.stack([feats[i - WINDOW:i] for i in idx])
    y = target[idx - 1]
    return torch.from_numpy(x), torch.from_numpy(y)


class DirectionLSTM(nn.Module):
    def __init__(self, n_features, hidden=48):
        super().__init__()
        self.lstm = nn.LSTM(n_features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1]).squeeze(-1)


def main():
    feats, target = preprocess(fetch_candles())
    x, y = make_windows(feats, target)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=False)
    model = DirectionLSTM(x.shape[-1])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    criterion = nn.BCEWithLogitsLoss()

    running, seen = 0.0, 0
    for step, (xb, yb) in enumerate(loader):
        logits = model(xb)
        loss = criterion(logits, yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running += loss.item() * len(yb)
        seen += len(yb)
        if step % 10 == 0:
            acc = ((logits > 0).float() == yb).float().mean().item()
            print(f"step {step:4d} bce {loss.item():.4f} running {running / seen:.4f} acc {acc:.3f}")


if __name__ == "__main__":
    main()
