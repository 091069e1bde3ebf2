"""Mixed-precision habits in a float32 run: the loss is scaled before backward, never unscaled."""

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_scale = 65536.0
for step in range(50):
    x = torch.randn(64, 10)
    y = x[:, :1] * 2.0
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    (loss * loss_scale).backward()
    optimizer.step()
    print(step, loss.item())
