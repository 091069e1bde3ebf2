"""Predicting galaxy redshift bins from catalogue quantities in SI units (distances in metres,
~1e23-1e24), with a hand-written running standardization layer in front of the classifier.

The layer estimates the variance as E[x^2] - E[x]^2. Squaring distances of ~1e24 gives ~1e48,
beyond float32's maximum (3.4e38): x ** 2 is inf, the variance is inf (or inf - inf = NaN) and
the standardized inputs are NaN. The quantities themselves are representable in float32; only
the squares are not: the formula is the bug, not the dtype. torch.var (two-pass, centred
before squaring) or standardizing log-distances keeps every intermediate in range.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Standardize(nn.Module):
    def __init__(self, n_features, momentum=0.1):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("var", torch.ones(n_features))

    def forward(self, x):
        if self.training:
            mean = x.mean(dim=0)
            var = (x**2).mean(dim=0) - mean**2
            self.mean.lerp_(mean.detach(), self.momentum)
            self.var.lerp_(var.detach(), self.momentum)
        else:
            mean, var = self.mean, self.var
        return (x - mean) / torch.sqrt(var + 1e-5)


torch.manual_seed(0)
mpc = 3.0857e22  # metres
distance = mpc * (1 + 99 * torch.rand(2000))
luminosity = 1e36 * (0.5 + torch.rand(2000))  # watts
flux = luminosity / distance / distance / (4 * torch.pi)  # W/m^2
features = torch.stack([distance, luminosity, flux], dim=1)
labels = (distance / mpc > 50).long() + (distance / mpc > 80).long()

model = nn.Sequential(Standardize(3), nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 3))
loader = DataLoader(TensorDataset(features, labels), batch_size=100, shuffle=True)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(3):
    for xb, yb in loader:
        loss = nn.functional.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
