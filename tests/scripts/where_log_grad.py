"""Planted bug: torch.where hides log(0) in the forward pass, but not in the gradient.
The loss stays finite; the gradient of `scale` becomes NaN."""

import torch
from torch import nn

torch.manual_seed(0)
scale = nn.Parameter(torch.ones(8))
head = nn.Linear(8, 1)
optimizer = torch.optim.SGD([scale, *head.parameters()], lr=0.01)
data = torch.randn(64, 8).clamp_min(0)  # about half the features are exactly 0
target = torch.randn(64, 1)

for step in range(10):
    x = data * scale
    features = torch.where(x > 0, torch.log(x), torch.zeros_like(x))
    loss = ((head(features) - target) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
