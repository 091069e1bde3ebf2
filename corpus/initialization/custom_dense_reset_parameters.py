"""Regression of a smooth 3-D function with a network of hand-written Dense layers.

Dense.reset_parameters draws weights from N(0, 10^2), a copy-paste of a "std=10" meant for
something else. With fan-in 64 the default scale is ~0.07, so every layer multiplies the
activation scale by ~50: the first predictions are ~1e10, the first update is enormous and the
run is NaN within a couple of steps.
"""

import math

import torch
from torch import nn


class Dense(nn.Module):
    def __init__(self, d_in, d_out, activation=True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        self.bias = nn.Parameter(torch.empty(d_out))
        self.activation = activation
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.weight, mean=0.0, std=10.0)
        nn.init.zeros_(self.bias)

    def forward(self, x):
        out = x @ self.weight.t() + self.bias
        return torch.nn.functional.gelu(out) if self.activation else out


class Regressor(nn.Module):
    def __init__(self, width=64, depth=5):
        super().__init__()
        dims = [3] + [width] * depth
        self.hidden = nn.ModuleList(Dense(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.out = Dense(width, 1, activation=False)

    def forward(self, x):
        for layer in self.hidden:
            x = layer(x)
        return self.out(x)


def target_fn(x):
    return torch.sin(math.pi * x[:, :1]) * torch.cos(x[:, 1:2]) + 0.5 * x[:, 2:3] ** 2


def train(steps=80, batch=128, lr=1e-3):
    torch.manual_seed(0)
    x_all = torch.rand(4096, 3) * 2 - 1
    y_all = target_fn(x_all)
    model = Regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        start = (step * batch) % len(x_all)
        xb, yb = x_all[start : start + batch], y_all[start : start + batch]
        loss = torch.mean((model(xb) - yb) ** 2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0 or step < 3:
            print(f"step {step} mse {loss.item():.4g}")


if __name__ == "__main__":
    train()
