"""Planted bug: float64 values beyond float32's range overflow to inf in `.float()`."""

import torch
from torch import nn

raw = torch.randn(32, 4, dtype=torch.float64)
raw[3, 1] = 1e39  # a sentinel value that float32 cannot hold
x = raw.float()
y = torch.randn(32, 1)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
