"""Planted bug: a curve fit with L-BFGS at its defaults, which take the quasi-Newton step at
lr=1 without a line search. A poor curvature estimate makes one step huge and the loss is nan
after a few outer steps; with `line_search_fn="strong_wolfe"` the same fit converges."""

import torch
from torch import nn

torch.manual_seed(1)
t = torch.linspace(0, 20, 200).unsqueeze(1)
y = torch.exp(-0.1 * t) * torch.sin(2 * t)
model = nn.Sequential(nn.Linear(1, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU(), nn.Linear(48, 1))
optimizer = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=20, history_size=10)  # fix here


def closure():
    optimizer.zero_grad()
    loss = ((model(t) - y) ** 2).mean()
    loss.backward()
    return loss


for step in range(30):
    loss = optimizer.step(closure)
    print(step, loss.item())
