"""Obstacle-distance regression from 2-D lidar scans, batched by hand.

Like a ROS LaserScan, the simulated scanner reports `inf` for beams that got no return (open
space beyond max range). The scans are turned into a tensor as they are, so the inf readings
go straight into the first Linear layer and the loss becomes NaN.
"""

import math

import numpy as np
import torch
from torch import nn

rng = np.random.default_rng(3)
n_scans, n_beams, max_range = 512, 64, 12.0
ranges = rng.uniform(0.5, 10.0, size=(n_scans, n_beams))
ranges[rng.random((n_scans, n_beams)) < 0.02] = np.inf  # no return
nearest = np.minimum(ranges.min(axis=1), max_range)

scans = torch.tensor(ranges, dtype=torch.float32)
target = torch.tensor(nearest, dtype=torch.float32).unsqueeze(1)

model = nn.Sequential(
    nn.Linear(n_beams, 128),
    nn.ReLU(),
    nn.Linear(128, 64),
    nn.ReLU(),
    nn.Linear(64, 1),
)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
batch_size = 64
steps_per_epoch = math.ceil(n_scans / batch_size)

for epoch in range(4):
    perm = torch.randperm(n_scans)
    running = 0.0
    for b in range(steps_per_epoch):
        idx = perm[b * batch_size : (b + 1) * batch_size]
        pred = model(scans[idx] / max_range)
        loss = (pred - target[idx]).abs().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running += loss.item()
    print(f"epoch {epoch}: L1 {running / steps_per_epoch:.3f}")
