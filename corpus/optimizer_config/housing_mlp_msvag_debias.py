"""Tabular house-price regression with a small MLP, trained with M-SVAG.

M-SVAG (Balles & Hennig, "Dissecting Adam") is vendored below from the optimizer
collection we use, so the experiment has no extra dependency.
"""
import argparse
import time

import torch
import torch.nn as nn
from torch.optim.optimizer import Optimizer
from torch.utils.data import DataLoader, Dataset


class MSVAG(Optimizer):
    """Momentum Stochastic Variance-Adapted Gradient."""

    def __init__(self, params, lr=1e-2, beta=0.9):
        if lr <= 0.0:
            raise ValueError(f"invalid learning rate: {lr}")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"invalid beta: {beta}")
        super().__init__(params, dict(lr=lr, beta=beta))

    @staticmethod
    def get_rho(beta_power, beta):
        rho = (1.0 - beta_power ** 2) * (1.0 - beta) ** 2
        rho /= (1.0 - beta) * (1.0 - beta_power) ** 2
        return min(rho, 0.9999)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1
            beta = group["beta"]
            beta_power = beta ** group["step"]

            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)

                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta).add_(grad, alpha=1.0 - beta)
                exp_avg_sq.mul_(beta).addcmul_(grad, grad, value=1.0 - beta)

                m = exp_avg.div(beta_power)
                v = exp_avg_sq.div(beta_power)

                rho = self.get_rho(beta_power, beta)

                m_p2 = m.pow(2)
                s = (v - m_p2).div_(1.0 - rho)

                factor = m_p2.div(m_p2 + rho * s)
                torch.nan_to_num(factor, nan=0.0, out=factor)
                factor.clamp_(0.0, 1.0)

                p.add_(m * factor, alpha=-group["lr"])

        return loss


class HousingDataset(Dataset):
    """Synthetic listings: area, rooms, age, distance to centre, floor, lot size."""

    def __init__(self, n, generator):
        area = 40 + 160 * torch.rand(n, generator=generator)
        rooms = torch.clamp((area / 30).round() + torch.randint(-1, 2, (n,), generator=generator), 1, 8)
        age = 60 * torch.rand(n, generator=generator)
        dist = 25 * torch.rand(n, generator=generator) ** 1.5
        floor = torch.randint(0, 12, (n,), generator=generator).float()
        lot = area * (1 + 2 * torch.rand(n, generator=generator))
        feats = torch.stack([area, rooms, age, dist, floor, lot], dim=1)
        price = (3.1 * area + 12 * rooms - 1.4 * age - 6.5 * dist + 1.5 * floor + 0.3 * lot
                 + 15 * torch.randn(n, generator=generator))
        self.x = feats
        self.y = price.unsqueeze(1)

    def normalise(self, stats=None):
        if stats is None:
            stats = (self.x.mean(0), self.x.std(0), self.y.mean(), self.y.std())
        xm, xs, ym, ys = stats
        self.x = (self.x - xm) / xs
        self.y = (self.y - ym) / ys
        return stats

    def __len__(self):
        return len(self.y)

    def __getitem__(self, idx):
        return self.x[idx], self.y[idx]


class PriceMLP(nn.Module):
    def __init__(self, in_dim=6, hidden=32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x):
        return self.net(x)


def train_one_epoch(model, loader, optimizer, loss_fn, epoch, global_step, log_every):
    model.train()
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        global_step += 1
        if global_step % log_every == 0:
            print(f"epoch {epoch:3d} step {global_step:5d} train_mse {loss.item():.5f}")
    return global_step


@torch.no_grad()
def evaluate(model, loader, loss_fn):
    model.eval()
    total, n = 0.0, 0
    for xb, yb in loader:
        total += loss_fn(model(xb), yb).item() * len(yb)
        n += len(yb)
    return total / n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--beta", type=float, default=0.9)
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    train_ds = HousingDataset(1024, g)
    val_ds = HousingDataset(256, g)
    stats = train_ds.normalise()
    val_ds.normalise(stats)

    train_loader = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, drop_last=True)
    val_loader = DataLoader(val_ds, batch_size=256)

    model = PriceMLP()
    optimizer = MSVAG(model.parameters(), lr=args.lr, beta=args.beta)
    loss_fn = nn.MSELoss()

    start = time.time()
    step = 0
    for epoch in range(1, args.epochs + 1):
        step = train_one_epoch(model, train_loader, optimizer, loss_fn, epoch, step, args.log_every)
        val = evaluate(model, val_loader, loss_fn)
        print(f"epoch {epoch:3d} val_mse {val:.5f} ({time.time() - start:.1f}s)")


if __name__ == "__main__":
    main()
