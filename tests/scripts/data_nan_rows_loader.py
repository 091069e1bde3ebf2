"""Planted bug: a feature table with missing values (NaN) in two rows, served by a shuffled
DataLoader with two worker processes. The bad rows reach the model at some step."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
features = torch.randn(256, 6)
features[[37, 150], 3] = float("nan")  # sensor 3 missing for two recordings
targets = features[:, :1].nan_to_num() * 0.5 + 0.1

loader = DataLoader(TensorDataset(features, targets), batch_size=32, shuffle=True, num_workers=2)
model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
