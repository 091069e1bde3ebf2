"""Planted bug: the autocast dtype is a module constant, float16, around a model whose first
backward sums the error of 8,192 rows: beyond float16's 65504. The constant is what to edit."""

import torch
from torch import nn

AMP_DTYPE = torch.float16  # fix here

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-9)
x = torch.rand(8192, 8)
y = torch.full((8192, 1), 3000.0)
for step in range(5):
    with torch.autocast("cpu", dtype=AMP_DTYPE):
        prediction = model(x)
    loss = (prediction.float() - y).pow(2).sum()  # a summed loss: gradients in the 1e7s
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4g}")
