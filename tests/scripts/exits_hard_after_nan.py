"""Planted bug, then the process dies without cleanup: `os._exit` (or a segfault with --segfault)
in a `finally` that runs once the failure has been seen."""

import ctypes
import os
import sys

import torch
from torch import nn

model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.rand(8, 4)
try:
    for step in range(10):
        scale = x.sum() * (0.0 if step == 2 else 1.0)
        loss = (model(x / scale) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
finally:
    if "--segfault" in sys.argv:
        ctypes.string_at(0)
    os._exit(0)
