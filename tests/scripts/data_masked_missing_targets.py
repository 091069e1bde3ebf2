"""Healthy: regression targets mark missing labels with NaN on purpose and the loss masks them
out, so no NaN ever reaches the loss. The scan may mention the NaN, as a hint only."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
inputs = torch.randn(160, 4)
targets = torch.cat([inputs[:, :1] * 2.0, inputs[:, 1:2] - inputs[:, 2:3]], dim=1)
targets[::5, 1] = float("nan")  # second label not measured for every fifth sample

loader = DataLoader(TensorDataset(inputs, targets), batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for x, y in loader:
    prediction = model(x)
    known = ~torch.isnan(y)
    loss = nn.functional.mse_loss(prediction[known], y[known])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
