"""Planted bug: under float16 autocast, a hand-written normalization divides by `sum + 1e-8`.
Padding rows (all zeros, from step 5) have features that are all 0 and sum to 0, and 1e-8 rounds to 0 in float16, so they divide 0
by 0. In float32 the same line gives 0 / 1e-8 = 0. The fix is the formula's line: compute it in
float32 (or use an eps float16 can hold); the autocast region stays."""

import torch
from torch import nn

torch.manual_seed(0)


class Normalized(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.proj = nn.Linear(8, features, bias=False)

    def forward(self, x):
        h = torch.relu(self.proj(x))
        return h / (h.sum(-1, keepdim=True) + 1e-8)  # the eps rounds away here


model = nn.Sequential(Normalized(16), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(30):
    x = torch.randn(32, 8)
    if step >= 5:
        x[:2] = 0.0  # padding rows
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = (out.float() - 1.0).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4g}")
