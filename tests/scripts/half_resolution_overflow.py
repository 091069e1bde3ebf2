"""Multi-resolution training whose per-sample conditioning is computed in float16 before the
forward: `height * width` of the 320x240 bucket (76,800) is past float16's 65,504, so the
conditioning input is inf from the first batch of that bucket on. The data carries finite
sizes; the dtype the script computes them in cannot hold their product."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(9, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
buckets = [(64, 48), (128, 96), (200, 150), (320, 240)]
for step in range(40):
    height, width = buckets[min(step // 8, 3)]
    sizes = torch.tensor([[height, width]] * 16, dtype=torch.float16)
    x = torch.randn(16, 8)
    resolution = sizes[:, :1] * sizes[:, 1:]  # the product, in float16
    features = torch.cat([x, resolution.float() / 1e4], dim=1)
    loss = (model(features) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
