"""Planted bug: the output layer is zero-initialised so the network starts as the identity,
then wrapped in weight_norm: its direction v is all zero and w = g * v / ||v|| is 0/0 at the
first forward."""

import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

torch.manual_seed(0)


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(weight_norm(nn.Linear(16, 32)), nn.Tanh())
        end = nn.Linear(32, 16)
        nn.init.zeros_(end.weight)  # the line to fix: a zero direction under weight_norm
        nn.init.zeros_(end.bias)
        self.end = weight_norm(end)

    def forward(self, x):
        return x + self.end(self.body(x))


model = Denoiser()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(20):
    clean = torch.randn(64, 16)
    noisy = clean + 0.1 * torch.randn(64, 16)
    loss = (model(noisy) - clean).abs().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
