"""Healthy: a plain MLP on CUDA when there is one (on the CPU otherwise). The CPU and the GPU
agree op by op and step by step: no divergence may be reported."""

import torch
from torch import nn

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(128, 16).to(device)
y = x[:, :1] * 2.0 - x[:, 1:2]
for step in range(10):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
