"""Planted bug: a Linear subclass overrides reset_parameters with N(0, 1) weights (set through
`.data`), about 28x the default scale at fan-in 256; eight of them in a row blow up the logits."""

import torch
from torch import nn


class PlainLinear(nn.Linear):
    def reset_parameters(self):
        self.weight.data.normal_(0.0, 1.0)
        nn.init.zeros_(self.bias)


torch.manual_seed(0)
blocks = []
for _ in range(8):
    blocks += [PlainLinear(256, 256), nn.ReLU()]
model = nn.Sequential(*blocks, nn.Linear(256, 10))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
for step in range(20):
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
