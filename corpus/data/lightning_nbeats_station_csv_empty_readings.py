"""N-BEATS style daily temperature forecaster (Lightning), trained on a weather-station CSV.

The station CSV has a few days where the logger was down: the date is there but
the temperature fields are empty.  ``np.genfromtxt`` silently turns the empty
fields into NaN and nothing fills them, so every training window that overlaps
the outage carries NaN inputs / targets.  Training windows are fed in time
order; the first batch reaching the outage (mid-way through epoch 0) gives a nan
loss, the Adam step writes NaN into every weight and the run never recovers.

Reproduces https://github.com/Nixtla/neuralforecast/issues/186 ("silent bug,
training with NaNs values": missing values in the y column make the loss nan
during training) -- same situation as neuralforecast#824, where the maintainer
pointed at the empty MaunaLoa daily-temperature rows and the fix was to fill
the missing values before fitting.
Fix: fill the missing temperatures when loading (linear interpolation over the
gap) -- trains cleanly.
"""
import csv
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import lightning as L
from torch.utils.data import DataLoader, Dataset

H = 12            # forecast horizon (days)
INPUT_SIZE = 2 * H


def write_station_csv(path, n_days=3650, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(n_days)
    temp = 22.0 + 3.5 * np.sin(2 * np.pi * t / 365.25) + 0.002 * t
    temp = temp + np.convolve(rng.standard_normal(n_days + 6), np.ones(7) / 7, 'valid') * 2.0
    outage = set(range(2870, 2874))          # four days without readings
    start = np.datetime64('2006-01-01')
    with open(path, 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['Date', 'MinTemp', 'MaxTemp', 'AvgTemp'])
        for d in range(n_days):
            day = str(start + np.timedelta64(d, 'D'))
            if d in outage:
                w.writerow([day, '', '', ''])
            else:
                w.writerow([day, f'{temp[d] - 4:.1f}', f'{temp[d] + 4:.1f}', f'{temp[d]:.1f}'])


def load_series(path, column='AvgTemp'):
    cols = {'MinTemp': 1, 'MaxTemp': 2, 'AvgTemp': 3}
    y = np.genfromtxt(path, delimiter=',', skip_header=1, usecols=cols[column], dtype=np.float32)
    return y


class WindowDataset(Dataset):
    def __init__(self, y, input_size, h):
        self.y = torch.from_numpy(y)
        self.input_size, self.h = input_size, h

    def __len__(self):
        return len(self.y) - self.input_size - self.h + 1

    def __getitem__(self, i):
        w = self.y[i:i + self.input_size + self.h]
        return w[:self.input_size], w[self.input_size:]


class NBeatsBlock(nn.Module):
    def __init__(self, input_size, h, hidden=128, n_layers=3):
        super().__init__()
        layers, d = [], input_size
        for _ in range(n_layers):
            layers += [nn.Linear(d, hidden), nn.ReLU()]
            d = hidden
        self.mlp = nn.Sequential(*layers)
        self.theta = nn.Linear(hidden, input_size + h)
        self.input_size = input_size

    def forward(self, x):
        theta = self.theta(self.mlp(x))
        return theta[:, :self.input_size], theta[:, self.input_size:]


class NBeats(L.LightningModule):
    def __init__(self, input_size=INPUT_SIZE, h=H, n_blocks=3, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.blocks = nn.ModuleList([NBeatsBlock(input_size, h) for _ in range(n_blocks)])
        self.loss_fn = nn.L1Loss()

    def forward(self, insample):
        # temporal 'standard' scaler computed on each window's insample part
        loc = insample.mean(1, keepdim=True)
        scale = insample.std(1, keepdim=True) + 1e-3
        residual = (insample - loc) / scale
        forecast = 0
        for block in self.blocks:
            backcast, f = block(residual)
            residual = residual - backcast
            forecast = forecast + f
        return forecast * scale + loc

    def training_step(self, batch, batch_idx):
        insample, target = batch
        y_hat = self(insample)
        loss = self.loss_fn(y_hat, target)
        if self.global_step % 5 == 0:
            print(f'epoch {self.current_epoch} step {self.global_step:4d} train_loss {loss.item():.4f}')
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main():
    L.seed_everything(1, verbose=False)
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, 'station_daily_temps.csv')
    write_station_csv(path)
    y = load_series(path, 'AvgTemp')
    print(f'loaded {len(y)} days, mean temp {np.nanmean(y):.2f}')

    train_loader = DataLoader(WindowDataset(y, INPUT_SIZE, H), batch_size=64, shuffle=False)
    model = NBeats()
    trainer = L.Trainer(max_epochs=3, accelerator='cpu', devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, train_loader)


if __name__ == '__main__':
    main()
