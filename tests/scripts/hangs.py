"""Trains one step, then hangs (a deadlocked data pipeline, say)."""

import time

import torch

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.randn(4, 2)).pow(2).mean()
loss.backward()
optimizer.step()
time.sleep(600)
