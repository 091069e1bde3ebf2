"""A training log opened before training and appended to every step; from step 300 on a sensor
column drops to zero before a log: the loss goes non-finite at step 300."""

import sys

import torch
from torch import nn

log = open(sys.argv[1], "a")  # noqa: SIM115 - held for the whole run, as training scripts do
torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.rand(64, 4) + 0.5
y = torch.randn(64, 1)
for step in range(400):
    batch = x.clone()
    if step >= 300:
        batch[:, 0] = 0.0  # the sensor drops out
    loss = nn.functional.mse_loss(model(torch.log(batch)), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    log.write(f"step {step} loss {loss.item():.4f}\n")
    log.flush()
