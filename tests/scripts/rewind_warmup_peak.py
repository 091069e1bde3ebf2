"""Linear warm-up over 300 steps to a peak learning rate this regression cannot train at
(it trains up to about lr 0.25): the loss diverges near the end of the warm-up."""

import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(256, 16)
y = x @ torch.randn(16, 1)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.27)
schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 300))
for step in range(600):
    batch = torch.randint(0, 256, (32,))
    loss = nn.functional.mse_loss(model(x[batch]), y[batch])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    schedule.step()
