"""Planted bug: Euclidean distance via sqrt of a sum of squares that is 0 for identical points.
The forward pass is finite; the backward of sqrt at 0 is infinite."""

import torch
from torch import nn

torch.manual_seed(0)
embed = nn.Linear(4, 3)
optimizer = torch.optim.SGD(embed.parameters(), lr=0.01)
points = torch.randn(16, 4)
pairs = torch.randint(0, 16, (32, 2))
pairs[:4, 1] = pairs[:4, 0]  # a few pairs compare a point with itself


def distances(z, index):
    diff = z[index[:, 0]] - z[index[:, 1]]
    return torch.sqrt((diff**2).sum(dim=-1))


for step in range(10):
    z = embed(points)
    d = distances(z, pairs)
    loss = (d - 1.0).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
