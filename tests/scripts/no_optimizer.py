"""Computes losses and gradients but never steps a torch.optim optimizer."""

import torch

weights = torch.nn.Parameter(torch.ones(3))
for _ in range(3):
    loss = (weights * 2).sum()
    loss.backward()
