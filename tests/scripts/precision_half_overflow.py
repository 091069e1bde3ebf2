"""Planted bug: a `.half()` model fed unnormalized features (prices up to 60000). Some outputs
of the first layer pass float16's maximum of 65504 and become inf; in float32 they would not."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 32), nn.ReLU(), nn.Linear(32, 1)).half()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-9)
prices = (torch.rand(32, 128) * 60000).half()
targets = torch.randn(32, 1).half()
for step in range(10):
    loss = nn.functional.mse_loss(model(prices), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
