"""Appends to a log and saves a checkpoint every step; goes NaN at step 4 (log of zero)."""

import os
import sys

import torch
from torch import nn

out = sys.argv[1]
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.rand(16, 4) + 0.5
y = torch.randn(16, 1)
for step in range(8):
    batch = x * (0.0 if step >= 4 else 1.0)
    loss = ((model(torch.log(batch)) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with open(os.path.join(out, "train.log"), "a") as log:
        log.write(f"step {step} loss {loss.item():.6f}\n")
    torch.save({"step": step, "model": model.state_dict()}, os.path.join(out, "last.pt"))
