"""Deep Sets regression on point clouds (coordinates in millimetres), with the model and data
cast to float16 with `.half()` to save memory, trained on the CPU.

Each point goes through a small MLP and the set is summed over its 1024 points. The per-point
features are in the hundreds, so the sum over the set reaches a few hundred thousand, beyond
float16's largest value (65504): the pooled features are inf and the loss NaN. In float32 the
same numbers are harmless; keep the model in float32 (or pool with a mean).
"""

import torch
from torch import nn


class DeepSets(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.phi = nn.Sequential(
            nn.Linear(3, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.rho = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, points):
        per_point = self.phi(points)
        pooled = per_point.sum(dim=1)
        return self.rho(pooled / 1024.0).squeeze(-1)


def sample_clouds(n, points=1024, generator=None):
    radius = 100 + 400 * torch.rand(n, 1, 1, generator=generator)  # mm
    direction = nn.functional.normalize(torch.randn(n, points, 3, generator=generator), dim=-1)
    return radius * direction, radius.view(n) / 100.0


torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
model = DeepSets().half()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
for step in range(30):
    clouds, size = sample_clouds(16, generator=gen)
    pred = model(clouds.half())
    loss = ((pred.float() - size) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
