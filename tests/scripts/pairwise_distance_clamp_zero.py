"""Planted bug: a batch-hard triplet loss over pairwise distances computed by the expansion
|a|^2 + |b|^2 - 2ab. Rounding makes some squared distances slightly negative, so they are
clamped at 0 before the square root, and a point's distance to itself is exactly 0 there:
the forward pass is finite, the derivative of sqrt at the clamp's bound is infinite."""

import torch
from torch import nn

torch.manual_seed(0)
embed = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
optimizer = torch.optim.SGD(embed.parameters(), lr=0.05)
points = torch.randn(32, 8)
labels = torch.arange(32) % 4


def pairwise_distances(z):
    squared = (z * z).sum(dim=1)
    d2 = squared.unsqueeze(1) + squared.unsqueeze(0) - 2.0 * z @ z.t()
    d2 = d2.clamp(min=0.0)
    return d2.sqrt()


def batch_hard_triplet_loss(z, y, margin=0.5):
    dist = pairwise_distances(z)
    same = y.unsqueeze(0) == y.unsqueeze(1)
    hardest_positive = (dist * same).max(dim=1).values
    hardest_negative = (dist + 1e6 * same).min(dim=1).values
    return torch.relu(hardest_positive - hardest_negative + margin).mean()


for step in range(10):
    loss = batch_hard_triplet_loss(embed(points), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
