"""PhaseNet-style P/S phase picker trained on windows cut from a continuous station record.

A 3-component (E, N, Z) 100 Hz record of one station is assembled from the acquisition
system's day segments; where telemetry dropped out, the segments are merged with
fill_value=0 (as obspy's Stream.merge(fill_value=0) does), so the gaps become runs of
exact zeros.  Training windows of 4 s are cut every second; labels are Gaussian P and S
masks plus a noise channel, and the picker is a small 1-D conv encoder/decoder trained with
a per-sample cross-entropy.

Each window is preprocessed as in the seismic-augmentation transforms: demean, then
normalise by the window's peak absolute amplitude.  A window that falls entirely inside a
telemetry gap has a peak of 0, so the normalisation is 0 / 0 and the whole window becomes
NaN.  The first batch that draws such a window gives a nan loss, the backward pass writes
NaN into every weight and the loss stays nan.

Reproduces: https://github.com/crimeacs/seismic-augmentation/pull/5 ("changed Normalize to
avoid division by zero"), which adds a small constant to the peak before dividing:
data / (data.abs().max(...) + 1e-8).
"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

FS = 100          # Hz
WIN = 400         # samples (4 s)
STRIDE = 100      # samples (1 s)


def ricker(f, length, fs):
    t = (np.arange(length) - length // 2) / fs
    a = (np.pi * f * t) ** 2
    return (1 - 2 * a) * np.exp(-a)


def make_record(minutes, rng):
    """Continuous E/N/Z record with local events; returns data, P picks, S picks, gaps."""
    n = minutes * 60 * FS
    data = rng.normal(0, 0.05, size=(3, n))
    p_picks, s_picks = [], []
    t = 3 * FS
    while t < n - 12 * FS:
        sp = int(rng.uniform(0.8, 2.5) * FS)                 # S-P time
        amp = rng.uniform(0.5, 3.0)
        p_wave, s_wave = ricker(8, 60, FS), ricker(4, 120, FS)
        data[2, t:t + 60] += amp * p_wave                      # P strongest on Z
        data[:2, t:t + 60] += 0.3 * amp * p_wave * rng.uniform(-1, 1, size=(2, 1))
        data[:2, t + sp:t + sp + 120] += 1.5 * amp * s_wave * rng.uniform(-1, 1, size=(2, 1))
        data[2, t + sp:t + sp + 120] += 0.4 * amp * s_wave
        p_picks.append(t + 30)
        s_picks.append(t + sp + 60)
        t += int(rng.uniform(6, 14) * FS)
    return data, np.array(p_picks), np.array(s_picks)


def merge_segments(data, gaps):
    """Telemetry dropouts: samples in each gap never arrived; merge fills them with 0."""
    merged = data.copy()
    for start, stop in gaps:
        merged[:, start:stop] = 0.0
    return merged


def gaussian_labels(n, picks, width=20):
    lab = np.zeros(n, np.float32)
    idx = np.arange(n)
    for p in picks:
        lo, hi = max(p - 3 * width, 0), min(p + 3 * width, n)
        lab[lo:hi] = np.maximum(lab[lo:hi], np.exp(-0.5 * ((idx[lo:hi] - p) / width) ** 2))
    return lab


class PhasePickDataset(Dataset):
    def __init__(self, record, p_lab, s_lab):
        self.record, self.p_lab, self.s_lab = record, p_lab, s_lab
        self.starts = np.arange(0, record.shape[1] - WIN, STRIDE)

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, i):
        s = self.starts[i]
        x = self.record[:, s:s + WIN].astype(np.float32)
        x = x - x.mean(axis=-1, keepdims=True)
        x = x / np.abs(x).max()
        p, sl = self.p_lab[s:s + WIN], self.s_lab[s:s + WIN]
        y = np.stack([p, sl, np.clip(1 - p - sl, 0, 1)])
        return torch.from_numpy(x), torch.from_numpy(y)


class TinyPhaseNet(nn.Module):
    def __init__(self, ch=8):
        super().__init__()
        self.inp = nn.Conv1d(3, ch, 7, padding=3)
        self.down1 = nn.Conv1d(ch, 2 * ch, 7, stride=4, padding=3)
        self.down2 = nn.Conv1d(2 * ch, 4 * ch, 7, stride=4, padding=3)
        self.up2 = nn.ConvTranspose1d(4 * ch, 2 * ch, 4, stride=4)
        self.up1 = nn.ConvTranspose1d(4 * ch, ch, 4, stride=4)
        self.out = nn.Conv1d(2 * ch, 3, 7, padding=3)

    def forward(self, x):
        h0 = F.relu(self.inp(x))
        h1 = F.relu(self.down1(h0))
        h2 = F.relu(self.down2(h1))
        u1 = F.relu(self.up2(h2))
        u0 = F.relu(self.up1(torch.cat([u1, h1], 1)))
        return self.out(torch.cat([u0, h0], 1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    raw, p_picks, s_picks = make_record(args.minutes, rng)
    gaps = [(int(7.3 * 60 * FS), int(7.3 * 60 * FS) + 450),      # telemetry dropouts (4.5 s, 2.3 s)
            (int(15.1 * 60 * FS), int(15.1 * 60 * FS) + 230)]
    record = merge_segments(raw, gaps)
    n = record.shape[1]
    ds = PhasePickDataset(record, gaussian_labels(n, p_picks), gaussian_labels(n, s_picks))
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(args.seed))
    print(f"{len(ds)} windows, {len(p_picks)} events, gaps {gaps}")

    model = TinyPhaseNet()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    step, running = 0, 0.0
    for epoch in range(args.epochs):
        for x, y in loader:
            logits = model(x)
            loss = -(y * F.log_softmax(logits, dim=1)).sum(1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            running += loss.item()
            if step % 20 == 0:
                print(f"epoch {epoch} step {step:4d}  loss {running / 20:.4f}")
                running = 0.0


if __name__ == "__main__":
    main()
