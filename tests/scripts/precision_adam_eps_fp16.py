"""Planted bug: a model trained in pure float16 (`.half()`) with Adam's default eps=1e-8. An
embedding row no batch touches has a zero gradient; eps rounds to 0 in float16, so its update
is 0/0 = NaN. In float64 the update is 0."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(10, 8), nn.Flatten(), nn.Linear(32, 1)).half()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
tokens = torch.randint(0, 5, (16, 4))  # ids 5..9 never occur: their rows get zero gradients
targets = torch.randn(16, 1).half()
for step in range(10):
    loss = nn.functional.mse_loss(model(tokens), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
