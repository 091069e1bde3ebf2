"""Fraud detection with a small MLP and a hand-written binary cross-entropy, in one
flat loop over hand-sliced mini-batches.

The loss is -(y*log(p) + (1-y)*log(1-p)) with p = sigmoid(logit). The classes separate easily,
the logits grow past ~17 within about 60 steps, and float32 sigmoid rounds to exactly 1.0:
log(1 - p) = log(0) = -inf and 0 * -inf = NaN. F.binary_cross_entropy_with_logits would not fail.
"""

import torch
from torch import nn

torch.manual_seed(0)
n = 4000
amount = torch.rand(n) * 50  # dollars, not normalized
night = (torch.rand(n) < 0.3).float()
foreign = (torch.rand(n) < 0.2).float()
x = torch.stack([amount, night, foreign, amount * foreign], dim=1)
y = ((amount > 30) | (foreign * amount > 20)).float()

model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
batch_size = 100
for epoch in range(6):
    perm = torch.randperm(n)
    for i in range(0, n, batch_size):
        idx = perm[i : i + batch_size]
        p = torch.sigmoid(model(x[idx]).squeeze(1))
        loss = -(y[idx] * torch.log(p) + (1 - y[idx]) * torch.log(1 - p)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} bce {loss.item():.4f}")
