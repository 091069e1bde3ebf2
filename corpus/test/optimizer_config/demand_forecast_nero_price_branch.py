"""Weekly demand forecaster trained with the Nero optimizer (pytorch_optimizer 2.5.x vendored).

Nero keeps every weight matrix "neuron-wise" centred and normalised: before the first update of a
parameter and after every update it does ``p -= neuron_mean(p); p /= neuron_norm(p)`` per output
row, with no epsilon.  The price covariate is fed through ``nn.Linear(1, 8)``, whose weight has
shape (8, 1): every row has a single entry, so centring it gives exactly 0 and the division is
0 / 0 = nan.  The price branch is only switched on after the warm-up epochs (before that its
parameters get no gradient, so Nero skips them), so the first two epochs train normally and the
loss is nan from the first step of epoch 2 on.

Reproduces: https://github.com/kozistr/pytorch_optimizer/issues/120 (Nero gives nan "under very
degenerated conditions"; the reporter pointed at ``p.div_(neuron_norm(p))`` and
``grad / (exp_avg_sq / bias_correction).sqrt()``), fixed by PR #121 "Add epsilon to stablize
the optimizing" (v2.5.2).

Fix: add ``eps`` to the denominators, i.e. ``p.div_(neuron_norm(p) + eps)`` (and
``grad / ((exp_avg_sq / bias_correction).sqrt() + eps)``); the same run then has no nan.
"""
import math

import numpy as np
import torch
import torch.nn as nn
from torch.optim.optimizer import Optimizer
from torch.utils.data import DataLoader, Dataset

CONFIG = {
    "n_stores": 40,
    "n_weeks": 160,
    "lags": 8,
    "batch_size": 128,
    "epochs": 5,
    "warmup_epochs": 2,      # train on lagged sales only, then add the price covariate
    "lr": 0.01,
    "seed": 7,
}


# ---------------------------------------------------------------- optimizer (vendored)
def neuron_norm(x):
    if x.dim() <= 1:
        return x.abs()
    view_shape = [x.shape[0]] + [1] * (x.dim() - 1)
    return x.view(x.shape[0], -1).norm(dim=1).view(*view_shape)


def neuron_mean(x):
    if x.dim() <= 1:
        raise ValueError("neuron_mean not defined on 1D tensors.")
    view_shape = [x.shape[0]] + [1] * (x.dim() - 1)
    return x.view(x.shape[0], -1).mean(dim=1).view(*view_shape)


class Nero(Optimizer):
    """Learning by Turning: Neural Architecture Aware Optimisation."""

    def __init__(self, params, lr=0.01, beta=0.999, constraints=True):
        self.beta = beta
        super().__init__(params, dict(lr=lr, constraints=constraints))

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
                grad = p.grad

                state = self.state[p]
                if len(state) == 0:
                    if group["constraints"] and p.dim() > 1:
                        p.sub_(neuron_mean(p))
                        p.div_(neuron_norm(p))

                    state["step"] = 0
                    state["exp_avg_sq"] = torch.zeros_like(neuron_norm(p))
                    state["scale"] = neuron_norm(p).mean()
                    if state["scale"] == 0.0:
                        state["scale"] = 0.01

                state["step"] += 1

                bias_correction = 1.0 - self.beta ** state["step"]
                state["exp_avg_sq"] = self.beta * state["exp_avg_sq"] + (1.0 - self.beta) * neuron_norm(grad) ** 2

                grad_normed = grad / (state["exp_avg_sq"] / bias_correction).sqrt()
                grad_normed[torch.isnan(grad_normed)] = 0.0

                p.sub_(group["lr"] * state["scale"] * grad_normed)

                if group["constraints"] and p.dim() > 1:
                    p.sub_(neuron_mean(p))
                    p.div_(neuron_norm(p))

        return loss


# ---------------------------------------------------------------- data
def simulate_sales(cfg, rng):
    weeks = np.arange(cfg["n_weeks"])
    base = rng.uniform(50, 200, size=(cfg["n_stores"], 1))
    season = 1.0 + 0.25 * np.sin(2 * math.pi * weeks / 52.0)[None, :]
    price = rng.uniform(2.0, 6.0, size=(cfg["n_stores"], cfg["n_weeks"]))
    elasticity = rng.uniform(0.3, 0.8, size=(cfg["n_stores"], 1))
    noise = rng.normal(0, 0.05, size=(cfg["n_stores"], cfg["n_weeks"]))
    sales = base * season * (price / 4.0) ** (-elasticity) * (1.0 + noise)
    return sales.astype(np.float32), price.astype(np.float32)


class DemandWindows(Dataset):
    def __init__(self, sales, price, lags):
        xs, ps, ys = [], [], []
        for s in range(sales.shape[0]):
            scale = sales[s].mean()
            for t in range(lags, sales.shape[1]):
                xs.append(sales[s, t - lags:t] / scale)
                ps.append([(price[s, t] - 4.0) / 1.2])
                ys.append(sales[s, t] / scale)
        self.x = torch.tensor(np.array(xs))
        self.p = torch.tensor(np.array(ps, dtype=np.float32))
        self.y = torch.tensor(np.array(ys, dtype=np.float32)).unsqueeze(1)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.p[i], self.y[i]


# ---------------------------------------------------------------- model
class DemandNet(nn.Module):
    def __init__(self, lags, hidden=32, price_dim=8):
        super().__init__()
        self.lag_encoder = nn.Sequential(
            nn.Linear(lags, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
        )
        self.price_branch = nn.Sequential(nn.Linear(1, price_dim), nn.Tanh())
        self.head = nn.Linear(hidden + price_dim, 1)
        self.price_dim = price_dim
        self.use_price = False

    def forward(self, lags, price):
        h = self.lag_encoder(lags)
        if self.use_price:
            e = self.price_branch(price)
        else:
            e = h.new_zeros(h.shape[0], self.price_dim)
        return self.head(torch.cat([h, e], dim=1))


def main(cfg):
    torch.manual_seed(cfg["seed"])
    rng = np.random.default_rng(cfg["seed"])
    sales, price = simulate_sales(cfg, rng)
    ds = DemandWindows(sales, price, cfg["lags"])
    loader = DataLoader(ds, batch_size=cfg["batch_size"], shuffle=True,
                        generator=torch.Generator().manual_seed(cfg["seed"]))

    model = DemandNet(cfg["lags"])
    optimizer = Nero(model.parameters(), lr=cfg["lr"])
    loss_fn = nn.MSELoss()

    step = 0
    for epoch in range(cfg["epochs"]):
        model.use_price = epoch >= cfg["warmup_epochs"]
        running = 0.0
        for x, p, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x, p), y)
            loss.backward()
            optimizer.step()
            running += loss.item()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step:4d} price_branch={model.use_price} mse {loss.item():.5f}")
            step += 1
        print(f"epoch {epoch} done, mean train mse {running / len(loader):.5f}")


if __name__ == "__main__":
    main(CONFIG)
