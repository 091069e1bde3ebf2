"""A 55M-parameter MLP (4 Linear layers, Adam, batch 256) whose loss takes log of a value that
reaches exactly 0 at step 3."""

import torch
from torch import nn

torch.manual_seed(0)
width = 5000
model = nn.Sequential(
    nn.Linear(1024, width),
    nn.ReLU(),
    nn.Linear(width, width),
    nn.ReLU(),
    nn.Linear(width, width),
    nn.ReLU(),
    nn.Linear(width, 1),
)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
x = torch.randn(256, 1024)
for step in range(10):
    out = model(x).squeeze(1)
    weights = torch.ones(256) if step < 3 else torch.zeros(256)  # a sample weighting that empties
    loss = -torch.log((out.sigmoid() * weights).mean())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
    if not torch.isfinite(loss):  # the script stops at the first non-finite loss
        break
