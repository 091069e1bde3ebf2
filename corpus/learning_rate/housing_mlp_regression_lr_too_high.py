"""Housing-price regression (13 features -> 200 hidden units -> price) in PyTorch Lightning.

Bug reproduced (learning rate): the network is trained with SGD (momentum 0.9) on
the raw UCI-Housing style features (tax rate, age, zoning share ... values up to
~100) and prices (5..50, in $1000s) with a learning rate of 0.1.  With inputs this
large every update overshoots: the squared error grows geometrically inside the
first epoch (batch 0: 5.3e2, batch 1: 4.6e12, batch 3: 6.1e22), at batch 4 the
forward pass squares an error of ~3e21 and the loss overflows float32 to inf; the
weights are pushed to ~1e33 and the squared error printed from then on is inf
("sqerr = 1.#QNAN" in the report).

Report: https://github.com/microsoft/CNTK/issues/699
  (a 13-200-1 regression network on the UCI Housing data: squared error huge from
  the start, growing every epoch, then NaN after a few epochs.  The maintainer's
  answer: the training is not converging, first reason: too large learning rate;
  earlier in the same thread lowering the learning rate is what made the reporter's
  simpler regression learn.)

Fix (maintainer's diagnosis): lower the learning rate -- here --lr 1e-5 instead of
0.1 (LR_DEFAULT below); the same network then trains and the MSE falls.
"""
import argparse
import math

import lightning as L
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = ["CRIM", "ZN", "INDUS", "CHAS", "NOX", "RM", "AGE",
            "DIS", "RAD", "TAX", "PTRATIO", "B", "LSTAT"]
LR_DEFAULT = 0.1


def make_housing_like(n, seed):
    """Synthetic stand-in for the UCI Housing table (raw, un-normalised units, < 100)."""
    rng = np.random.default_rng(seed)
    crim = np.clip(rng.exponential(3.6, n), 0, 89)
    zn = np.where(rng.random(n) < 0.73, 0.0, rng.uniform(12, 100, n))
    indus = rng.uniform(0.5, 27.7, n)
    chas = (rng.random(n) < 0.07).astype(float)
    nox = rng.uniform(0.38, 0.87, n)
    rm = rng.normal(6.28, 0.7, n)
    age = rng.uniform(3, 100, n)
    dis = rng.uniform(1.1, 12.0, n)
    rad = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 24], n).astype(float)
    tax = rng.uniform(18.7, 71.1, n)          # per $100k, /10
    ptratio = rng.uniform(12.6, 22.0, n)
    b = np.clip(rng.normal(35.7, 9.0, n), 0.3, 39.7)
    lstat = rng.uniform(1.7, 38.0, n)
    x = np.stack([crim, zn, indus, chas, nox, rm, age, dis, rad, tax, ptratio, b, lstat], 1)
    price = 22.5 + 4.5 * (rm - 6.28) - 0.5 * (lstat - 12.6) - 0.8 * (ptratio - 18.5) - 0.1 * crim
    price = np.clip(price + rng.normal(0, 3.0, n), 5.0, 50.0)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(price, dtype=torch.float32).unsqueeze(1)


class HousingDataModule(L.LightningDataModule):
    def __init__(self, batch_size, seed):
        super().__init__()
        self.batch_size = batch_size
        self.seed = seed

    def setup(self, stage=None):
        x, y = make_housing_like(506, self.seed)
        self.train_set = TensorDataset(x[:456], y[:456])
        self.val_set = TensorDataset(x[456:], y[456:])

    def train_dataloader(self):
        g = torch.Generator().manual_seed(self.seed)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, generator=g)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=50)


class HousingRegressor(L.LightningModule):
    def __init__(self, in_dim=13, hidden=200, lr=LR_DEFAULT, momentum=0.9):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.criterion = nn.MSELoss()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.criterion(self(x), y)
        self.log("train_sqerr", loss, on_step=True, on_epoch=True)
        if batch_idx % 3 == 0:
            print(f"epoch {self.current_epoch} batch {batch_idx:2d}  sqerr = {loss.item():.6g}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_sqerr", self.criterion(self(x), y))

    def on_train_epoch_end(self):
        sq = self.trainer.callback_metrics.get("train_sqerr_epoch")
        if sq is not None:
            print(f"Finished Epoch[{self.current_epoch + 1}]: sqerr = {float(sq):.6g}"
                  + ("  <-- not finite" if not math.isfinite(float(sq)) else ""))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr,
                               momentum=self.hparams.momentum)


def parse_args():
    p = argparse.ArgumentParser(description="UCI housing regression (13-200-1 MLP)")
    p.add_argument("--lr", type=float, default=LR_DEFAULT)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=25)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


def main():
    args = parse_args()
    L.seed_everything(args.seed, workers=True)
    torch.set_num_threads(2)
    dm = HousingDataModule(args.batch_size, args.seed)
    model = HousingRegressor(hidden=args.hidden, lr=args.lr, momentum=args.momentum)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    trainer.fit(model, datamodule=dm)
    print("final val_sqerr =", float(trainer.callback_metrics.get("val_sqerr", float("nan"))))


if __name__ == "__main__":
    main()
