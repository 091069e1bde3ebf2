"""Planted bug: features loaded with numpy carry NaN (a missing value in the CSV); they become a
tensor through torch.from_numpy and poison the loss."""

import numpy as np
import torch
from torch import nn

rng = np.random.default_rng(0)
table = rng.normal(size=(64, 5)).astype(np.float32)
table[7, 2] = np.nan  # a missing value
features = torch.from_numpy(table)
targets = torch.randn(64, 1)

model = nn.Linear(5, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    loss = nn.functional.mse_loss(model(features), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
