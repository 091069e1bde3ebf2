"""Planted bug: a learning rate typed as 5e5 instead of 5e-5, set in a config dict."""

import torch
from torch import nn

config = {"lr": 5e5, "epochs": 30}  # the typo
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
x = torch.randn(128, 8)
y = x[:, :1] * 3
for step in range(config["epochs"]):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4g}")
