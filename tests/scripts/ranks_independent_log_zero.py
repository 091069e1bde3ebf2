"""Planted bug under torchrun, with no process group: each rank trains on its own. Rank 1 takes
log of a zero at step 2; rank 0 stays finite and keeps training for much longer."""

import os
import time

import torch
from torch import nn

rank = int(os.environ["RANK"])
torch.manual_seed(rank)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(400):
    x = torch.rand(8, 4) + 0.5
    if rank == 1 and step == 2:
        x[0, 0] = 0.0
    loss = (model(torch.log(x)) ** 2).mean()  # log(0) = -inf on rank 1
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    time.sleep(0.05)
