"""Discrete-time survival model (logistic hazard / Nnet-survival) for customer churn.

Customer export is read from CSV, durations are discretised on an equidistant
grid (pycox LabTransDiscreteTime style), covariates are standardised, and an
MLP with BatchNorm predicts per-interval hazards.  Trained with the negative
log-likelihood of the logistic hazard model.
"""
import csv
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

CONFIG = {
    "num_durations": 10,
    "batch_size": 32,
    "epochs": 8,
    "lr": 0.01,
    "hidden": [32, 32],
    "dropout": 0.1,
    "seed": 1234,
}

FEATURES = ["monthly_charges", "total_charges", "support_calls", "app_minutes_per_week",
            "contract_months", "paperless", "n_products", "age"]


def export_customers(path, n=1500, seed=0):
    rng = np.random.default_rng(seed)
    contract = rng.choice([1, 12, 24], n, p=[0.5, 0.3, 0.2])
    monthly = rng.uniform(18, 120, n).round(2)
    calls = rng.poisson(1.5, n)
    app = rng.gamma(2.0, 30.0, n).round(1)
    age = rng.integers(18, 80, n)
    products = rng.integers(1, 5, n)
    paperless = rng.integers(0, 2, n)
    risk = 0.02 * (monthly - 60) + 0.4 * calls - 0.01 * app - 0.08 * contract - 0.2 * products
    time_to_churn = rng.exponential(24 * np.exp(-risk))
    censor = rng.uniform(1, 60, n)
    tenure = np.maximum(1, np.minimum(time_to_churn, censor)).round()
    churned = (time_to_churn <= censor).astype(int)
    total = (monthly * tenure).round(2)
    no_app = rng.choice(n, 2, replace=False)          # customers who never installed the app
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["customer_id"] + FEATURES + ["tenure", "churned"])
        for i in range(n):
            row = [f"C{i:05d}", monthly[i], total[i], calls[i],
                   "" if i in no_app else app[i], contract[i], paperless[i], products[i], age[i],
                   int(tenure[i]), churned[i]]
            w.writerow(row)


def load_customers(path):
    table = np.genfromtxt(path, delimiter=",", names=True, dtype=None, encoding="utf-8")
    x = np.stack([table[c].astype(np.float32) for c in FEATURES], axis=1)
    durations = table["tenure"].astype(np.float32)
    events = table["churned"].astype(np.float32)
    return x, durations, events


class StandardScaler:
    """Column-wise z-score; like sklearn, statistics ignore missing entries."""

    def fit(self, x):
        self.mean_ = np.nanmean(x, axis=0)
        self.scale_ = np.nanstd(x, axis=0)
        self.scale_[self.scale_ == 0] = 1.0
        return self

    def transform(self, x):
        return ((x - self.mean_) / self.scale_).astype(np.float32)


class LabTransDiscreteTime:
    def __init__(self, num_durations):
        self.num_durations = num_durations

    def fit(self, durations):
        self.cuts = np.linspace(0, durations.max(), self.num_durations, dtype=np.float32)
        return self

    def transform(self, durations, events):
        idx = np.searchsorted(self.cuts, durations, side="left")
        idx = np.clip(idx, 0, self.num_durations - 1)
        return idx.astype(np.int64), events.astype(np.float32)


class SurvDataset(Dataset):
    def __init__(self, x, idx_durations, events):
        self.x = torch.from_numpy(x)
        self.idx = torch.from_numpy(idx_durations)
        self.events = torch.from_numpy(events)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.idx[i], self.events[i]


class MLPVanilla(nn.Module):
    def __init__(self, in_features, hidden, out_features, dropout):
        super().__init__()
        layers, d = [], in_features
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU(), nn.BatchNorm1d(h), nn.Dropout(dropout)]
            d = h
        layers.append(nn.Linear(d, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def nll_logistic_hazard(phi, idx_durations, events):
    y_bce = torch.zeros_like(phi).scatter(1, idx_durations.view(-1, 1), events.view(-1, 1))
    bce = F.binary_cross_entropy_with_logits(phi, y_bce, reduction="none")
    loss = bce.cumsum(1).gather(1, idx_durations.view(-1, 1)).view(-1)
    return loss.mean()


def run_epoch(model, loader, opt=None):
    model.train(opt is not None)
    total, n = 0.0, 0
    for x, idx, ev in loader:
        with torch.set_grad_enabled(opt is not None):
            loss = nll_logistic_hazard(model(x), idx, ev)
        if opt is not None:
            opt.zero_grad()
            loss.backward()
            opt.step()
        total += loss.item() * len(x)
        n += len(x)
    return total / n


def main():
    cfg = CONFIG
    torch.manual_seed(cfg["seed"])
    rng = np.random.default_rng(cfg["seed"])
    path = os.path.join(tempfile.mkdtemp(prefix="churn_"), "customers.csv")
    export_customers(path)

    x, durations, events = load_customers(path)
    perm = rng.permutation(len(x))
    n_val = int(0.2 * len(x))
    val_i, train_i = perm[:n_val], perm[n_val:]

    scaler = StandardScaler().fit(x[train_i])
    labtrans = LabTransDiscreteTime(cfg["num_durations"]).fit(durations[train_i])
    train_set = SurvDataset(scaler.transform(x[train_i]), *labtrans.transform(durations[train_i], events[train_i]))
    val_set = SurvDataset(scaler.transform(x[val_i]), *labtrans.transform(durations[val_i], events[val_i]))
    train_loader = DataLoader(train_set, batch_size=cfg["batch_size"], shuffle=True, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=256)

    model = MLPVanilla(x.shape[1], cfg["hidden"], cfg["num_durations"], cfg["dropout"])
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])

    step = 0
    for epoch in range(cfg["epochs"]):
        model.train()
        for xb, idx, ev in train_loader:
            loss = nll_logistic_hazard(model(xb), idx, ev)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step:4d} loss {loss.item():.4f}")
            step += 1
        val_loss = run_epoch(model, val_loader)
        print(f"epoch {epoch} val_loss {val_loss:.4f}")


if __name__ == "__main__":
    main()
