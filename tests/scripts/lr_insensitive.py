"""Planted bug unrelated to the learning rate: batch 6 holds a zero feature that goes through
log(), so the loss is -inf at step 6 whatever the step size."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
batches = [torch.rand(32, 8) + 0.5 for _ in range(30)]
batches[6][3, 2] = 0.0
for step, batch in enumerate(batches):
    features = torch.log(batch)  # log(0) = -inf in batch 6
    loss = (model(features) - 1.0).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
