"""Planted bug that fires late: from step 6 on, one feature column is zeroed before a log."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.rand(32, 4) + 0.5
y = torch.randn(32, 1)
for step in range(12):
    batch = x.clone()
    if step >= 6:
        batch[:, 0] = 0.0  # a sensor drops out
    loss = nn.functional.mse_loss(model(torch.log(batch)), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
