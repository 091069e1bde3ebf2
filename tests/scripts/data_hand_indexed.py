"""Planted bug: features loaded into one tensor hold +Inf in a few rows (a divide-by-zero when
the table was built); the script slices mini-batches by hand, no DataLoader."""

import torch
from torch import nn

torch.manual_seed(0)
raw = torch.rand(200, 4) + 0.5
counts = torch.randint(1, 5, (200, 1)).float()
counts[[11, 120]] = 0.0  # two records with no events
X = torch.cat([raw, raw[:, :1] / counts], dim=1)  # rate feature: +Inf where count is 0
Y = raw.sum(dim=1, keepdim=True)

model = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(12):
    order = torch.randperm(200)[:20]
    xb, yb = X[order], Y[order]
    loss = nn.functional.mse_loss(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
