"""Healthy: logs exp(100 x loss) as a "sharpness" metric that overflows to inf in float32 on
every early step, and trains on without a NaN/Inf in its loss, gradients or weights."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(64, 8)
y = x.sum(dim=1, keepdim=True)
for step in range(30):
    loss = nn.functional.mse_loss(model(x), y)
    sharpness = torch.exp(100 * loss).item()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4g} sharpness {sharpness:.3g}")
