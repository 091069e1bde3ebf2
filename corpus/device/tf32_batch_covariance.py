"""Predicting heater power from a 16-thermistor array (readings in kelvin, ~293 K with
~1 K spread), with a batch-standardization layer that takes the feature covariance from one
matmul, E[x x^T] - mean mean^T. TF32 matmuls are switched on for speed.

Needs a CUDA GPU with TF32 (Ampere or newer) to fail; on the CPU it trains normally. The
variances (~0.5 K^2) are the small difference of two numbers of ~86000. In float32 the matmul
x^T x / n is accurate to a few hundredths, so the difference stays positive. A TF32 matmul reads only 10
mantissa bits of each operand and is off by tens, so some variances come out negative and
their square root is NaN. Same code, same seed: finite on the CPU, NaN on the GPU. Disabling
TF32, or centring x before the matmul, fixes it.
"""

import torch
from torch import nn

torch.backends.cuda.matmul.allow_tf32 = True
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class BatchStandardize(nn.Module):
    def forward(self, x):
        n = x.shape[0]
        mean = x.mean(dim=0)
        second_moment = x.t() @ x / n
        cov = second_moment - torch.outer(mean, mean)
        std = cov.diagonal().sqrt()
        return (x - mean) / (std + 1e-5)


def read_sensors(n, generator):
    ambient = 293.0 + 0.5 * torch.randn(n, 1, generator=generator)
    heater = torch.rand(n, 1, generator=generator)
    gains = torch.linspace(0.2, 1.6, 16)
    temps = ambient + heater * gains + 0.5 * torch.randn(n, 16, generator=generator)
    return temps, heater


torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
model = nn.Sequential(BatchStandardize(), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(60):
    temps, power = read_sensors(64, gen)
    temps, power = temps.to(device), power.to(device)
    loss = nn.functional.mse_loss(model(temps), power)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0 or not torch.isfinite(loss):
        print(f"step {step} loss {loss.item():.4f}")
