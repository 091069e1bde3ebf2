"""Planted bug: a module normalizes by a sum that is exactly zero for some rows (0/0)."""

import torch
from torch import nn


class SumNormalize(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return h / h.sum(dim=-1, keepdim=True)  # rows where every unit is off: 0/0


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(6, 6), SumNormalize(6)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(6, 1)

    def forward(self, x):
        return self.head(self.encoder(x))


torch.manual_seed(0)
model = Net()
with torch.no_grad():
    model.encoder.layers[1].fc.bias.fill_(-5.0)  # most units start switched off
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 6), torch.randn(64, 1)
for step in range(10):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
