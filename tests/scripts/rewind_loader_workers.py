"""Batches from a DataLoader with a worker process; sample 1200 is corrupt (NaN), first drawn at
step 300. The worker lives through each epoch, so no step boundary can be forked."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
features = torch.randn(1600, 4)
features[1200, 2] = float("nan")  # one corrupt reading
dataset = TensorDataset(features, features[:, :1] * 2.0)
loader = DataLoader(dataset, batch_size=4, num_workers=1)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for inputs, targets in loader:
    loss = nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
