"""Trains one step, then hangs (a deadlocked data pipeline, say). With a path argument, it
touches that file once the step is done."""

import sys
import time

import torch

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.randn(4, 2)).pow(2).mean()
loss.backward()
optimizer.step()
if len(sys.argv) > 1:
    open(sys.argv[1], "w").close()
time.sleep(600)
