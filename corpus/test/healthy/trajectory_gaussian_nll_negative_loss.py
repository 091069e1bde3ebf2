"""Agent trajectory forecasting with a Gaussian output head (mean + std for every
future (x, y) step) trained with a Gaussian negative log-likelihood.

Looks suspicious: the printed "NLL" starts large and positive, crosses zero and
goes *negative* (about -0.8), which users often read as a broken loss.  It is
fine: the NLL of a continuous density is negative once the predicted std is
below ~0.24 (density > 1).  Nothing diverges; no NaN/Inf ever appears.

Report: https://github.com/roggirg/AutoBots/issues/7 ("Question about negative
loss" - maintainer: "this is normal behavior. NLL can have negative values when
parameterizing Gaussian distributions").
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(7)
np.random.seed(7)

PAST, FUTURE = 8, 12


class SyntheticAgents(Dataset):
    """Constant-turn-rate agents with small position noise (metres, walking pace)."""

    def __init__(self, n=3000, noise=0.03):
        T = PAST + FUTURE
        speed = np.random.uniform(0.2, 0.4, size=(n, 1))
        heading = np.random.uniform(-math.pi, math.pi, size=(n, 1))
        turn = np.random.uniform(-0.03, 0.03, size=(n, 1))
        t = np.arange(T)[None, :]
        ang = heading + turn * t
        steps = np.stack([speed * np.cos(ang), speed * np.sin(ang)], axis=-1)
        traj = np.cumsum(steps, axis=1)
        traj = traj - traj[:, PAST - 1:PAST]          # agent-centric frame
        traj += noise * np.random.randn(*traj.shape)
        self.traj = torch.tensor(traj, dtype=torch.float32)

    def __len__(self):
        return len(self.traj)

    def __getitem__(self, i):
        return self.traj[i, :PAST], self.traj[i, PAST:]


class GaussianForecaster(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.enc = nn.GRU(2, hidden, batch_first=True)
        self.dec = nn.Sequential(nn.Linear(hidden, 128), nn.ReLU(), nn.Linear(128, FUTURE * 4))

    def forward(self, past):
        _, h = self.enc(past)
        out = self.dec(h[-1]).view(-1, FUTURE, 4)
        mu = out[..., :2]
        sigma = F.softplus(out[..., 2:]) + 1e-3
        return mu, sigma


def gaussian_nll(mu, sigma, target):
    # -log N(target | mu, sigma^2), averaged over steps and coordinates
    return (torch.log(sigma) + 0.5 * ((target - mu) / sigma) ** 2 + 0.5 * math.log(2 * math.pi)).mean()


def main():
    train = DataLoader(SyntheticAgents(3000), batch_size=64, shuffle=True)
    val = DataLoader(SyntheticAgents(500), batch_size=250)
    model = GaussianForecaster()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    step = 0
    for epoch in range(20):
        model.train()
        for past, fut in train:
            mu, sigma = model(past)
            loss = gaussian_nll(mu, sigma, fut)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 100 == 0:
                print(f"step {step:4d}  nll {loss.item():+.4f}  mean sigma {sigma.mean().item():.4f}")
            step += 1
        model.eval()
        with torch.no_grad():
            ade, nll = 0.0, 0.0
            for past, fut in val:
                mu, sigma = model(past)
                ade += (mu - fut).norm(dim=-1).mean().item()
                nll += gaussian_nll(mu, sigma, fut).item()
        print(f"epoch {epoch}  val nll {nll / len(val):+.4f}  val ADE {ade / len(val):.3f} m")


if __name__ == "__main__":
    main()
