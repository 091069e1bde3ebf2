"""Trains one step, then hangs (a deadlocked data pipeline, say). With a path argument, it
writes its process id into that file once the step is done."""

import os
import sys
import time

import torch

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loss = model(torch.randn(4, 2)).pow(2).mean()
loss.backward()
optimizer.step()
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as marker:
        marker.write(str(os.getpid()))
time.sleep(600)
