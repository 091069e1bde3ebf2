"""False-alarm guard: a healthy model compiled with `model.compile()` trains without NaN/Inf."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
model.compile(backend="eager")
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
x = torch.randn(64, 8)
y = x.sum(dim=1, keepdim=True)
for step in range(6):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
