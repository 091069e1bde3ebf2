"""Fitting a small MLP surrogate with torch.optim.LBFGS and no line search.

Reproduces https://github.com/pytorch/pytorch/issues/5953 ("LBFGS always give nan results, why"):
with the default line_search_fn=None, LBFGS takes fixed steps of length lr along the quasi-Newton
direction; when the curvature pairs are poor the step is huge, the loss jumps to inf and the
iterates become nan.  DeepXDE hit the same with its L-BFGS backend and switched the default to
the strong-Wolfe line search (https://github.com/lululxvi/deepxde/pull/1790).

Fix: torch.optim.LBFGS(..., line_search_fn="strong_wolfe").
"""
import math

import torch
import torch.nn as nn

torch.manual_seed(0)

# noisy samples of a damped oscillation, as a 1-D surrogate-model fit
t = torch.linspace(0, 4 * math.pi, 256).unsqueeze(1)
y = torch.exp(-0.15 * t) * torch.sin(3 * t) + 0.02 * torch.randn_like(t)

model = nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=20, history_size=10)


def closure():
    optimizer.zero_grad()
    loss = ((model(t) - y) ** 2).mean()
    loss.backward()
    return loss


for step in range(60):
    loss = optimizer.step(closure)
    print(f"outer step {step:3d}  loss {loss.item():.6f}")
