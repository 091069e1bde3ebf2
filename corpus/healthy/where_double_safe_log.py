"""Healthy: a log-normal likelihood for positive targets with some exact zeros (a hurdle model),
written with the "double where": the zeros are replaced by 1 *before* the log, so neither the
forward value nor its gradient is ever non-finite. A Huber-style piecewise penalty built with
torch.where on safe branches is added for good measure."""

import torch
import torch.nn.functional as F
from torch import nn


class HurdleModel(nn.Module):
    def __init__(self, d_in=6):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, 32), nn.SiLU(), nn.Linear(32, 3))

    def forward(self, x):
        logit_zero, mu, log_sigma = self.body(x).unbind(dim=1)
        return logit_zero, mu, log_sigma.clamp(-5, 5)


def hurdle_nll(logit_zero, mu, log_sigma, y):
    is_zero = y == 0
    safe_y = torch.where(is_zero, torch.ones_like(y), y)
    log_y = torch.log(safe_y)
    lognormal = log_sigma + log_y + 0.5 * ((log_y - mu) / log_sigma.exp()) ** 2
    nll_pos = F.softplus(logit_zero) + lognormal
    nll_zero = F.softplus(-logit_zero)
    return torch.where(is_zero, nll_zero, nll_pos).mean()


def huber(residual, delta=1.0):
    a = residual.abs()
    return torch.where(a < delta, 0.5 * residual**2, delta * (a - 0.5 * delta)).mean()


torch.manual_seed(0)
x = torch.randn(2000, 6)
y = torch.exp(0.5 * x[:, 0] + 0.2 * torch.randn(2000))
y[x[:, 1] > 0.5] = 0.0  # no purchase
model = HurdleModel()
optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
for epoch in range(4):
    for idx in torch.randperm(2000).split(100):
        logit_zero, mu, log_sigma = model(x[idx])
        loss = hurdle_nll(logit_zero, mu, log_sigma, y[idx]) + 0.1 * huber(mu - x[idx, 0] * 0.5)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
