"""House-price regressor in PyTorch Lightning with the RAdam optimizer vendored from
LiyuanLucasLiu/RAdam (radam.py), using ``degenerated_to_sgd=True``.

RAdam's variance rectification is undefined for the first steps (N_sma < 5, i.e. the first four
updates with beta2=0.999).  With ``degenerated_to_sgd=True`` those updates fall back to plain SGD
with momentum at the Adam-sized learning rate: ``p -= lr * exp_avg / (1 - beta1**t)``, with no
division by sqrt(v).  The tabular features are fed as exported (floor area in square feet, up to
4500), so the first-layer gradients are in the thousands and the un-normalised SGD steps blow
the weights up: the step-0 MSE of ~2e3 becomes ~1e17 at step 1, inf at step 2, and the loss is
nan from step 3 on.  Adam (or RAdam that skips the un-rectified steps) divides by sqrt(v) and
trains on the same data.

Reproduces: https://github.com/LiyuanLucasLiu/RAdam/issues/61 ("NaNs": RAdam produces NaN loss
in the first epochs where Adam does not); the maintainer's answer is the known issue of
https://github.com/LiyuanLucasLiu/RAdam/issues/54 (SGD-with-momentum warm-up steps diverge when
max(abs(X)) is large) and the fix is ``degenerated_to_sgd=False``.

Fix: ``RAdam(..., degenerated_to_sgd=False)``; the run then trains (val_mse 32 after epoch 0,
~0.5 after 10 epochs).
"""
import math
import os
import tempfile

import lightning as L
import numpy as np
import torch
import torch.nn as nn
from torch.optim.optimizer import Optimizer
from torch.utils.data import DataLoader, TensorDataset


class RAdam(Optimizer):
    """Rectified Adam, as in LiyuanLucasLiu/RAdam radam/radam.py."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 degenerated_to_sgd=True):
        self.degenerated_to_sgd = degenerated_to_sgd
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        buffer=[[None, None, None] for _ in range(10)])
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.float()
                p_fp32 = p.float()
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p_fp32)
                    state["exp_avg_sq"] = torch.zeros_like(p_fp32)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                beta1, beta2 = group["betas"]
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                state["step"] += 1

                buffered = group["buffer"][int(state["step"] % 10)]
                if state["step"] == buffered[0]:
                    n_sma, step_size = buffered[1], buffered[2]
                else:
                    buffered[0] = state["step"]
                    beta2_t = beta2 ** state["step"]
                    n_sma_max = 2 / (1 - beta2) - 1
                    n_sma = n_sma_max - 2 * state["step"] * beta2_t / (1 - beta2_t)
                    buffered[1] = n_sma
                    if n_sma >= 5:
                        step_size = math.sqrt(
                            (1 - beta2_t) * (n_sma - 4) / (n_sma_max - 4) * (n_sma - 2) / n_sma
                            * n_sma_max / (n_sma_max - 2)) / (1 - beta1 ** state["step"])
                    elif self.degenerated_to_sgd:
                        step_size = 1.0 / (1 - beta1 ** state["step"])
                    else:
                        step_size = -1
                    buffered[2] = step_size

                if n_sma >= 5:
                    if group["weight_decay"] != 0:
                        p_fp32.add_(p_fp32, alpha=-group["weight_decay"] * group["lr"])
                    denom = exp_avg_sq.sqrt().add_(group["eps"])
                    p_fp32.addcdiv_(exp_avg, denom, value=-step_size * group["lr"])
                    p.copy_(p_fp32)
                elif step_size > 0:
                    if group["weight_decay"] != 0:
                        p_fp32.add_(p_fp32, alpha=-group["weight_decay"] * group["lr"])
                    p_fp32.add_(exp_avg, alpha=-step_size * group["lr"])
                    p.copy_(p_fp32)
        return loss


COLUMNS = ["sqft", "age_years", "lot_100sqft", "bedrooms", "dist_center_km", "price_100k"]


def write_listings_csv(path, n=4000, seed=0):
    rng = np.random.default_rng(seed)
    sqft = rng.uniform(500, 4500, n)
    year = rng.integers(1900, 2021, n)
    lot = rng.lognormal(8.5, 0.8, n)
    beds = rng.integers(1, 6, n)
    dist = rng.uniform(0.5, 40, n)
    price = (50 + 0.12 * sqft + 0.4 * (year - 1900) + 0.002 * lot + 8 * beds - 2.5 * dist
             + rng.normal(0, 25, n)) / 100.0
    # exported from the listings DB: floor area in sq ft, age in years, lot in 100 sq ft
    table = np.stack([sqft, 2021 - year, lot / 100, beds, dist, price], axis=1)
    np.savetxt(path, table, delimiter=",", header=",".join(COLUMNS), comments="", fmt="%.4f")


class ListingsDataModule(L.LightningDataModule):
    def __init__(self, csv_path, batch_size=64):
        super().__init__()
        self.csv_path = csv_path
        self.batch_size = batch_size

    def setup(self, stage=None):
        table = np.loadtxt(self.csv_path, delimiter=",", skiprows=1, dtype=np.float32)
        x = torch.from_numpy(table[:, :-1])
        y = torch.from_numpy(table[:, -1:])
        self.train_ds = TensorDataset(x[:3500], y[:3500])
        self.val_ds = TensorDataset(x[3500:], y[3500:])

    def train_dataloader(self):
        return DataLoader(self.train_ds, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_ds, batch_size=500)


class PriceRegressor(L.LightningModule):
    def __init__(self, n_features=5, hidden=64, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(n_features, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )
        self.loss_fn = nn.MSELoss()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.loss_fn(self(x), y)
        self.log("train_mse", loss)
        if self.global_step < 5 or self.global_step % 20 == 0:
            print(f"step {self.global_step} train_mse {loss.item():.5g}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_mse", self.loss_fn(self(x), y))

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            print(f"epoch {self.current_epoch} val_mse {self.trainer.callback_metrics['val_mse'].item():.5g}")

    def configure_optimizers(self):
        return RAdam(self.parameters(), lr=self.hparams.lr, weight_decay=1e-5, degenerated_to_sgd=True)


def main():
    L.seed_everything(42, verbose=False)
    csv_path = os.path.join(tempfile.mkdtemp(), "listings.csv")
    write_listings_csv(csv_path)

    model = PriceRegressor()
    trainer = L.Trainer(
        max_epochs=10, accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, datamodule=ListingsDataModule(csv_path))


if __name__ == "__main__":
    main()
