"""Planted bug: a metric-learning head allocates its class prototypes with `torch.empty` and the
model's init helper only visits Linear layers, so they are never filled. What they hold is up to
the allocator: zero pages in a short plain run (the cosine's 0/0 is NaN at once), stale finite
values in a long-lived process (the run trains on garbage)."""

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)


class PrototypeHead(nn.Module):
    def __init__(self, dim, classes):
        super().__init__()
        prototypes = torch.empty(classes, dim)  # the line to fix: never initialized
        self.prototypes = nn.Parameter(prototypes)

    def forward(self, features):
        return 10.0 * F.normalize(features, dim=1) @ F.normalize(self.prototypes, dim=1).t()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32))
        self.head = PrototypeHead(32, 10)
        # A scratch buffer allocated the same way and filled before use: not a finding.
        self.register_buffer("center", torch.empty(32))
        self.center.zero_()

    def forward(self, x):
        return self.head(self.body(x) - self.center)


model = Net()
for module in model.modules():
    if isinstance(module, nn.Linear):
        nn.init.kaiming_uniform_(module.weight)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    x, y = torch.randn(32, 16), torch.randint(0, 10, (32,))
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
