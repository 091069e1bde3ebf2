"""A curriculum that admits more of a sensor log each epoch; one reading of row 300 is corrupt
(NaN), and the curriculum first reaches it in epoch 34, well past step 100."""

import numpy as np
import torch
from torch import nn

rng = np.random.default_rng(0)
readings = rng.normal(size=(512, 8)).astype(np.float32)
readings[300, 3] = np.nan  # a corrupt reading in the log
targets = readings[:, :1] * 0.5 - readings[:, 1:2]
inputs, labels = torch.from_numpy(readings), torch.from_numpy(targets)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
step = 0
for epoch in range(40):
    admitted = 32 + 8 * epoch  # the curriculum: the first rows only, then more each epoch
    for start in range(0, admitted, 32):
        end = min(start + 32, admitted)
        loss = nn.functional.mse_loss(model(inputs[start:end]), labels[start:end])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
    print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
