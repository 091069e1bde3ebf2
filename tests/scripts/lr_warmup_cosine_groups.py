"""Healthy: two param groups with different learning rates, linear warmup then cosine decay.

Both schedulers update the learning rate recursively from the group's current value, so a
multiplier that leaked into the groups between steps would compound and bend the schedule.
"""

import torch
from torch import nn

torch.manual_seed(0)
body = nn.Sequential(nn.Linear(8, 16), nn.Tanh())
head = nn.Linear(16, 1)
optimizer = torch.optim.SGD(
    [{"params": body.parameters(), "lr": 0.05}, {"params": head.parameters(), "lr": 0.01}],
    momentum=0.9,
)
warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=5)
cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=20)
scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warmup, cosine], milestones=[5])
x = torch.randn(64, 8)
y = x[:, :1] - x[:, 1:2]
for step in range(25):
    loss = nn.functional.mse_loss(head(body(x)), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
