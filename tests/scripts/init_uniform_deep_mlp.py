"""Planted bug: a deep MLP whose every parameter is re-initialized with U(-100, 100), hundreds of
times PyTorch's default scale. The first forward already overflows float32."""

import torch
from torch import nn


class DeepMLP(nn.Module):
    def __init__(self, width=64, depth=16, classes=10):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


torch.manual_seed(0)
model = DeepMLP()
for p in model.parameters():
    nn.init.uniform_(p, -100, 100)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
for step in range(10):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
