"""Planted bug, hidden behind `except Exception: pass` around every step (a log of zero)."""

import torch
from torch import nn

model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.rand(16, 4)
for step in range(10):
    try:
        probs = torch.softmax(model(x), dim=1) * (0.0 if step >= 3 else 1.0)
        loss = -torch.log(probs).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    except Exception:
        pass
print("training finished")
