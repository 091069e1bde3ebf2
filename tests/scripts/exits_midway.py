"""Calls sys.exit(CODE) after a few healthy steps; CODE is the first argument."""

import sys

import torch

code = int(sys.argv[1])
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    loss = model(torch.randn(4, 2)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step == 2:
        sys.exit(code)
