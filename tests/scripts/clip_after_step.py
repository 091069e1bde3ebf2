"""Planted bug: the gradients are clipped after `optimizer.step()`, which has already applied
them unclipped. The rare batch with a huge target then throws the weights out and the loss goes
inf, then nan; clipping between `backward()` and `step()` trains."""

import torch
from torch import nn

torch.manual_seed(0)
features = torch.randn(2048, 16)
targets = features @ torch.randn(16, 1) + 0.1 * torch.randn(2048, 1)
targets[1500] = 1e6  # one record entered in the wrong unit

model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

for step in range(64):
    batch = slice(step * 32, step * 32 + 32)
    loss = nn.functional.mse_loss(model(features[batch]), targets[batch])
    loss.backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)  # fix here
    optimizer.zero_grad()
    print(step, loss.item())
