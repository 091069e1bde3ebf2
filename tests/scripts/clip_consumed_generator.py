"""Planted bug: the parameters to clip are taken once as `model.parameters()`, a generator. The
first clip reads it; every later clip gets nothing, so the rare batch with a huge target
updates unclipped and the loss goes inf, then nan. With `list(model.parameters())` (or the
call inside the loop) the same run trains."""

import torch
from torch import nn

torch.manual_seed(0)
features = torch.randn(2048, 16)
targets = features @ torch.randn(16, 1) + 0.1 * torch.randn(2048, 1)
targets[1500] = 1e6  # one record entered in the wrong unit

model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
params_to_clip = model.parameters()  # fix here

for step in range(64):
    batch = slice(step * 32, step * 32 + 32)
    loss = nn.functional.mse_loss(model(features[batch]), targets[batch])
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params_to_clip, max_norm=1.0)
    optimizer.step()
    print(step, loss.item())
