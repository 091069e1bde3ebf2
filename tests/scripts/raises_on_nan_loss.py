"""A trainer that checks its loss before backward and raises on NaN (as pytorch-fcn's does):
SGD with momentum at a learning rate far too high makes the weights overflow, and the loss it
reads with `.item()` is inf or nan a few steps in; the script never calls backward on it."""

import math

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
x = torch.randn(128, 16)
y = x.sum(dim=1, keepdim=True)
for step in range(50):
    loss = nn.functional.mse_loss(model(x), y)
    value = loss.item()
    print(f"step {step} loss {value:.4g}")
    if math.isnan(value) or math.isinf(value):
        raise ValueError("loss is nan while training")
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
