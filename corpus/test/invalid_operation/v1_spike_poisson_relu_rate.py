"""System-identification model of V1 responses: conv core + per-neuron linear readout.

Synthetic recording: 48 neurons with Gabor-like receptive fields respond to 20x20
natural-ish noise images with Poisson spike counts.  The readout ends in a ReLU so the
predicted firing rates are non-negative, and training minimises the Poisson
negative log-likelihood.  Readout biases start at the mean response of each neuron.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

N_NEURONS, SIZE = 48, 20


def gabor_bank(n, size, g):
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    filters = []
    for _ in range(n):
        cx, cy = (torch.rand(2, generator=g) - 0.5).tolist()
        theta = float(torch.rand(1, generator=g)) * math.pi
        freq = 2.0 + 4.0 * float(torch.rand(1, generator=g))
        xr = (xx - cx) * math.cos(theta) + (yy - cy) * math.sin(theta)
        env = torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 0.08)
        filters.append(env * torch.cos(2 * math.pi * freq * xr / 2))
    return torch.stack(filters)


def simulate_session(n_trials=2400, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = F.avg_pool2d(torch.randn(n_trials, 1, SIZE + 2, SIZE + 2, generator=g), 3, stride=1)
    images = images / images.std()
    rf = gabor_bank(N_NEURONS, SIZE, g)
    drive = torch.einsum("nhw,bhw->bn", rf, images[:, 0]) / 6.0
    base = torch.exp(torch.randn(N_NEURONS, generator=g) * 0.8 - 1.5)   # 0.05 .. 1 spikes / bin
    rates = base * torch.exp(drive.clamp(max=3.0))
    spikes = torch.poisson(rates, generator=g)
    return images, spikes


class Core(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, c, 7, padding=3), nn.BatchNorm2d(c), nn.ELU(),
                                 nn.Conv2d(c, c, 5, padding=2), nn.BatchNorm2d(c), nn.ELU())

    def forward(self, x):
        return self.net(x)


class FactorizedReadout(nn.Module):
    def __init__(self, c, size, n_neurons, mean_response):
        super().__init__()
        self.spatial = nn.Parameter(torch.randn(n_neurons, size * size) * 0.01)
        self.features = nn.Parameter(torch.randn(n_neurons, c) * 0.01)
        self.bias = nn.Parameter(mean_response.clone())

    def forward(self, f):
        b, c, h, w = f.shape
        pooled = torch.einsum("bcp,np->bnc", f.flatten(2), self.spatial)
        return (pooled * self.features).sum(-1) + self.bias


class V1Model(nn.Module):
    def __init__(self, mean_response, c=16):
        super().__init__()
        self.core = Core(c)
        self.readout = FactorizedReadout(c, SIZE, N_NEURONS, mean_response)

    def forward(self, x):
        return F.relu(self.readout(self.core(x)))


def poisson_loss(rate, spikes):
    return (rate - spikes * torch.log(rate)).mean()


def correlation(pred, target):
    p, t = pred - pred.mean(0), target - target.mean(0)
    return ((p * t).sum(0) / (p.norm(dim=0) * t.norm(dim=0) + 1e-8)).mean().item()


def main():
    torch.manual_seed(0)
    images, spikes = simulate_session()
    train_x, train_y, val_x, val_y = images[:2000], spikes[:2000], images[2000:], spikes[2000:]
    loader = DataLoader(TensorDataset(train_x, train_y), batch_size=64, shuffle=True)
    model = V1Model(train_y.mean(0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    step = 0
    for epoch in range(6):
        model.train()
        for x, y in loader:
            loss = poisson_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 20 == 0:
                print(f"epoch {epoch:2d} step {step:4d} poisson {loss.item():.4f}")
            step += 1
        model.eval()
        with torch.no_grad():
            pred = model(val_x)
            print(f"epoch {epoch:2d} val poisson {poisson_loss(pred, val_y).item():.4f} "
                  f"val corr {correlation(pred, val_y):.3f}")


if __name__ == "__main__":
    main()
