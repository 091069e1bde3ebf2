"""Updates its parameters by hand, as pytorch/examples' word_language_model does
(`p.data.add_(p.grad, alpha=-lr)`, no torch.optim optimizer), with a learning rate far too
high: the loss grows step by step until it overflows."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
x = torch.randn(64, 8)
y = x.sum(dim=1, keepdim=True)
lr = 3.0
for step in range(200):
    model.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    print(f"step {step} loss {loss.item():.4g}")
