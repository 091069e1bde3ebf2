"""Reports perplexity as pytorch/examples' word_language_model does (`math.exp(loss)`, a
Python float): the learning rate is far too high, the loss grows by orders of magnitude, and
`math.exp` raises OverflowError long before any tensor holds a NaN/Inf."""

import math

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
x = torch.randn(64, 8)
y = x.sum(dim=1, keepdim=True)
for step in range(100):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4g} perplexity {math.exp(loss.item()):.4g}")
