"""Planted bug: Adam with eps=0; embedding rows that never appear in a batch get exactly zero
gradients, and the update divides 0 by 0."""

import torch
from torch import nn

torch.manual_seed(0)
embedding = nn.Embedding(10, 4)
head = nn.Linear(4, 1)
optimizer = torch.optim.Adam([*embedding.parameters(), *head.parameters()], lr=1e-2, eps=0.0)
tokens = torch.randint(0, 5, (16,))  # rows 5..9 are never used
targets = torch.randn(16, 1)
for step in range(5):
    loss = ((head(embedding(tokens)) - targets) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
