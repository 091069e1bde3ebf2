"""Planted bug: a hand-written cross-entropy takes log of probabilities that are exactly 0."""

import torch
import torch.nn.functional as F
from torch import nn

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 8)
y = torch.randint(0, 4, (32,))

for step in range(20):
    probs = F.softmax(model(x) * 1000.0, dim=1)  # saturated softmax: some probabilities are 0
    loss = -torch.log(probs[torch.arange(32), y]).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
