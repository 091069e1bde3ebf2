"""Planted bug: the step runs through a closure (as Lightning's and L-BFGS's do), and the
gradients are clipped inside it before `backward()`, right after `zero_grad()`: there is
nothing to clip yet. The rare batch with a huge target updates unclipped and the loss goes
inf, then nan; clipping after `backward()` trains."""

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

    def closure(batch=batch):
        optimizer.zero_grad()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)  # fix here
        loss = nn.functional.mse_loss(model(features[batch]), targets[batch])
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    print(step, loss.item())
