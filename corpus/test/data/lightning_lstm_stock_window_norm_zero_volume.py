"""LSTM stock-price forecaster (Lightning) with per-window normalisation p / p0 - 1.

Each training window is normalised column-wise relative to its first row,
normalised = p / window[0] - 1, as in the LSTM-Neural-Network-for-Time-Series-Prediction
project.  The volume column of this ticker has a few days with zero traded volume (trading
halts), so every window that starts on such a day divides by zero: the volume column
becomes inf / nan for that window.  Training runs normally until the first batch that holds
one of those windows, then the loss is nan and the LSTM weights are nan from there on.

Report: https://github.com/jaungiers/LSTM-Neural-Network-for-Time-Series-Prediction/issues/66
("I have many 0 data in my train data, the function normalise_windows will have the issues:
float division by zero").
Fix (answer in the thread): guard the division -- skip / leave unscaled the columns whose base
value is zero (or add an epsilon to the denominator).
"""
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import lightning as L
from torch.utils.data import DataLoader, TensorDataset

SEQ_LEN = 50
BATCH = 32


def make_csv(path, n_days=2400, seed=3):
    rng = np.random.default_rng(seed)
    close = 40.0 * np.exp(np.cumsum(rng.normal(0.0004, 0.015, n_days)))
    volume = rng.lognormal(13.0, 0.35, n_days).round()
    halted = [1012, 1388, 2025]          # trading halts: no volume that day
    volume[halted] = 0.0
    with open(path, "w") as f:
        f.write("Day,Close,Volume\n")
        for d in range(n_days):
            f.write(f"{d},{close[d]:.2f},{volume[d]:.0f}\n")


def normalise_windows(windows):
    out = []
    for window in windows:
        norm = np.empty_like(window)
        for col_i in range(window.shape[1]):
            norm[:, col_i] = window[:, col_i] / window[0, col_i] - 1.0
        out.append(norm)
    return np.stack(out)


class StockDataModule(L.LightningDataModule):
    def __init__(self, csv_path, cols=("Close", "Volume"), split=0.85):
        super().__init__()
        self.csv_path = csv_path
        self.cols = list(cols)
        self.split = split

    def setup(self, stage=None):
        table = np.genfromtxt(self.csv_path, delimiter=",", names=True)
        data = np.stack([table[c] for c in self.cols], axis=1).astype(np.float64)
        i_split = int(len(data) * self.split)
        train = data[:i_split]
        windows = np.stack([train[i:i + SEQ_LEN + 1] for i in range(len(train) - SEQ_LEN)])
        windows = normalise_windows(windows).astype(np.float32)
        x = torch.from_numpy(windows[:, :-1])
        y = torch.from_numpy(windows[:, -1, [0]])
        self.train_ds = TensorDataset(x, y)

    def train_dataloader(self):
        return DataLoader(self.train_ds, batch_size=BATCH, shuffle=False)


class LSTMForecaster(L.LightningModule):
    def __init__(self, n_features=2, hidden=64, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.lstm = nn.LSTM(n_features, hidden, num_layers=2, batch_first=True, dropout=0.2)
        self.head = nn.Linear(hidden, 1)
        self.loss_fn = nn.MSELoss()

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.loss_fn(self(x), y)
        self.log("train_loss", loss)
        if self.global_step % 5 == 0:
            print(f"epoch {self.current_epoch} step {self.global_step} loss {loss.item():.6f}")
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main():
    L.seed_everything(7, verbose=False)
    tmp = tempfile.mkdtemp()
    csv_path = os.path.join(tmp, "ticker.csv")
    make_csv(csv_path)

    dm = StockDataModule(csv_path)
    model = LSTMForecaster()
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=dm)


if __name__ == "__main__":
    main()
