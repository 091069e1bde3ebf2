"""Forecast daily index closes with a small N-BEATS style network (PyTorch Lightning).

The closes come from the exchange calendar (trading days only). They are put on a
regular business-day grid, min-max scaled, cut into (lookback, horizon) windows and
fed to a generic N-BEATS stack trained with MSE.
"""
import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

LOOKBACK = 30
HORIZON = 5
HOLIDAYS = ["01-01", "01-16", "02-20", "05-29", "07-04", "09-04", "11-23", "12-25"]


def load_closes(start="2015-01-01", end="2019-12-31", seed=3):
    """Trading-day closes as the exchange publishes them (no rows on holidays)."""
    rng = np.random.default_rng(seed)
    days = np.arange(np.datetime64(start), np.datetime64(end), dtype="datetime64[D]")
    days = days[np.is_busday(days)]
    month_day = np.array([str(d)[5:] for d in days])
    days = days[~np.isin(month_day, HOLIDAYS)]
    log_ret = rng.normal(0.0003, 0.011, size=len(days))
    close = 17800.0 * np.exp(np.cumsum(log_ret))
    return days, close


def to_regular_series(dates, values, freq="B", fill_missing_dates=True):
    """Put observations on a regular time grid (one slot per `freq` step)."""
    if not fill_missing_dates:
        return dates, values
    grid = np.arange(dates[0], dates[-1] + 1, dtype="datetime64[D]")
    if freq == "B":
        grid = grid[np.is_busday(grid)]
    out = np.full(len(grid), np.nan)
    out[np.searchsorted(grid, dates)] = values
    return grid, out


class MinMaxScaler:
    def fit(self, x):
        self.lo, self.hi = np.nanmin(x), np.nanmax(x)
        return self

    def transform(self, x):
        return (x - self.lo) / (self.hi - self.lo)


class WindowDataset(Dataset):
    def __init__(self, series):
        self.series = torch.as_tensor(series, dtype=torch.float32)

    def __len__(self):
        return len(self.series) - LOOKBACK - HORIZON + 1

    def __getitem__(self, i):
        window = self.series[i:i + LOOKBACK + HORIZON]
        return window[:LOOKBACK], window[LOOKBACK:]


class IndexDataModule(L.LightningDataModule):
    def __init__(self, batch_size=64):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage=None):
        dates, close = load_closes()
        dates, close = to_regular_series(dates, close, freq="B", fill_missing_dates=True)
        split = int(len(close) * 0.85)
        scaler = MinMaxScaler().fit(close[:split])
        scaled = scaler.transform(close)
        print(f"series: {len(scaled)} business days from {dates[0]} to {dates[-1]}")
        self.train_set = WindowDataset(scaled[:split])
        self.val_set = WindowDataset(scaled[split - LOOKBACK:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=256)


class GenericBlock(nn.Module):
    def __init__(self, width=128, layers=3):
        super().__init__()
        mods, d = [], LOOKBACK
        for _ in range(layers):
            mods += [nn.Linear(d, width), nn.ReLU()]
            d = width
        self.fc = nn.Sequential(*mods)
        self.backcast = nn.Linear(width, LOOKBACK)
        self.forecast = nn.Linear(width, HORIZON)

    def forward(self, x):
        h = self.fc(x)
        return self.backcast(h), self.forecast(h)


class NBeats(L.LightningModule):
    def __init__(self, n_blocks=4, width=128, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.blocks = nn.ModuleList([GenericBlock(width) for _ in range(n_blocks)])

    def forward(self, x):
        residual, forecast = x, 0.0
        for block in self.blocks:
            back, fore = block(residual)
            residual = residual - back
            forecast = forecast + fore
        return forecast

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        if batch_idx % 10 == 0:
            print(f"epoch {self.current_epoch} batch {batch_idx:3d} train_mse {loss.item():.6f}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_losses.append(F.mse_loss(self(x), y).item())

    def on_validation_epoch_start(self):
        self.val_losses = []

    def on_validation_epoch_end(self):
        print(f"epoch {self.current_epoch} val_mse {np.mean(self.val_losses):.6f}")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main():
    torch.manual_seed(42)
    L.seed_everything(42, verbose=False)
    dm = IndexDataModule()
    model = NBeats()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm)


if __name__ == "__main__":
    main()
