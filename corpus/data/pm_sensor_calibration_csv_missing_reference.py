"""Low-cost PM10 sensor calibration with a small Transformer over sliding windows
(TESLA-style: raw sensor channel + calendar features -> co-located reference value).

The per-site CSV exports are read with np.genfromtxt.  The reference analyser at one
site was offline for two one-minute readings, which the export writes as empty
fields; genfromtxt silently turns them into NaN.  Nothing downstream filters them,
so the two windows whose target is one of those readings carry a NaN label.  The
first shuffled batch that holds one (step 180, after the RMSE has fallen from 54 to
~4 ug/m3) gives a NaN loss and AdamW writes NaN into every weight.

Reproduces: https://github.com/circleAhn/TESLA-tf/issues/1
("Train Nan": all losses NaN on a self-built SensEURCity CSV; the authors answer
that the data has missing/NaN values that they removed in preprocessing).
Fix: drop the rows with missing values after reading the CSV, e.g.
    raw = raw[~np.isnan(raw).any(axis=1)]
"""
import argparse
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import ConcatDataset, DataLoader, Dataset

COLUMNS = ["timestamp", "day", "day_of_week", "hour", "minute", "5310CAT", "OPCN3PM10"]


def export_site_csv(path, n_rows, seed, offline_rows=()):
    """Write one site's minute data as the monitoring network exports it."""
    rng = np.random.default_rng(seed)
    t0 = 1_583_020_800 + seed * 86_400 * 7          # spring 2020, one week offset per site
    ts = t0 + 60 * np.arange(n_rows)
    minutes = (ts // 60) % 60
    hours = (ts // 3600) % 24
    days = (ts // 86_400) % 31 + 1
    dow = (ts // 86_400 + 3) % 7
    # reference PM10: diurnal cycle + slow weather + noise
    slow = np.cumsum(rng.normal(0, 0.4, n_rows))
    slow = slow - np.convolve(slow, np.ones(240) / 240, mode="same")
    ref = 22 + 9 * np.sin(2 * np.pi * (hours + minutes / 60 - 7) / 24) + 2.5 * slow
    ref = np.clip(ref + rng.normal(0, 1.0, n_rows), 1, None)
    # low-cost sensor: non-linear, humidity-like drift, noisy
    raw = 0.7 * ref + 0.006 * ref ** 2 + 4 * np.sin(2 * np.pi * hours / 24) + rng.normal(0, 2.0, n_rows)
    with open(path, "w") as f:
        f.write(",".join(COLUMNS) + "\n")
        for i in range(n_rows):
            ref_txt = "" if i in offline_rows else f"{ref[i]:.2f}"
            f.write(f"{ts[i]},{days[i]},{dow[i]},{hours[i]},{minutes[i]},{raw[i]:.2f},{ref_txt}\n")


class SiteWindows(Dataset):
    """Sliding windows over one site's CSV: X = (window, 5) features, y = reference at window end."""

    def __init__(self, csv_path, window, max_sensor_scale=300.0):
        raw = np.genfromtxt(csv_path, delimiter=",", skip_header=1, usecols=(1, 2, 3, 4, 5, 6))
        feats = np.stack([
            raw[:, 4] / max_sensor_scale,                 # raw sensor value
            raw[:, 0] / 31.0, raw[:, 1] / 7.0,             # day, day_of_week
            raw[:, 2] / 24.0, raw[:, 3] / 60.0,            # hour, minute
        ], axis=1).astype(np.float32)
        self.x = torch.from_numpy(feats)
        self.y = torch.from_numpy((raw[:, 5] / max_sensor_scale).astype(np.float32))
        self.window = window

    def __len__(self):
        return len(self.y) - self.window + 1

    def __getitem__(self, i):
        return self.x[i:i + self.window], self.y[i + self.window - 1:i + self.window]


class Calibrator(nn.Module):
    def __init__(self, window, d_model=32, nhead=4, layers=2):
        super().__init__()
        self.inp = nn.Linear(5, d_model)
        self.pos = nn.Parameter(torch.zeros(1, window, d_model))
        enc_layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(enc_layer, layers)
        self.out = nn.Linear(d_model, 1)

    def forward(self, x):
        h = self.encoder(self.inp(x) + self.pos)
        return self.out(h[:, -1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--window_size", type=int, default=30)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--epoch", type=int, default=1)
    p.add_argument("--learning_rate", type=float, default=1e-3)
    p.add_argument("--max_sensor_scale", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=2024)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    with tempfile.TemporaryDirectory(prefix="senseurcity_") as data_dir:
        csv_list = []
        for k, site in enumerate(["ANT_4043", "ANT_40E5", "ANT_4047", "ANT_4065"]):
            path = os.path.join(data_dir, f"Antwerp_{site}_FirstCol.csv")
            export_site_csv(path, n_rows=3000, seed=k, offline_rows=(1873, 1874) if k == 2 else ())
            csv_list.append(path)
        train_set = ConcatDataset([SiteWindows(p, args.window_size, args.max_sensor_scale) for p in csv_list])
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))

    model = Calibrator(args.window_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    mse = nn.MSELoss()

    step = 0
    for epoch in range(args.epoch):
        for xb, yb in loader:
            pred = model(xb)
            loss = mse(pred, yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 20 == 0:
                rmse = loss.detach().sqrt() * args.max_sensor_scale
                print(f"epoch {epoch} step {step:4d}  loss {loss.item():.6f}  rmse(ug/m3) {rmse.item():.2f}")
            step += 1


if __name__ == "__main__":
    main()
