"""Healthy: an optimizer wrapper in the style of accelerate's, stepping an inner SGD that shares
its param groups. Both are torch.optim optimizers, so both steps fire the global step hooks."""

import torch
from torch import nn


class SharedGroups(torch.optim.Optimizer):
    def __init__(self, inner):
        params = [p for group in inner.param_groups for p in group["params"]]
        super().__init__(params, dict(inner.defaults))
        self.inner = inner
        self.param_groups = inner.param_groups

    def step(self, closure=None):
        return self.inner.step(closure)


torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = SharedGroups(torch.optim.SGD(model.parameters(), lr=0.1))
x, y = torch.randn(32, 4), torch.randn(32, 1)
for step in range(5):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
