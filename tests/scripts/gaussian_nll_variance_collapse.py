"""A Gaussian policy fitted to ±1 actions by a hand-written negative log-likelihood. The tanh
mean saturates at exactly ±1, so the likelihood keeps rewarding a smaller standard deviation
(softplus, with nothing bounding it below) until the variance is so small that the gradient of
the squared error over it overflows."""

import torch
import torch.nn.functional as F

torch.manual_seed(0)
states = torch.randn(256, 4)
actions = torch.sign(states[:, :1] + 0.5 * states[:, 1:2])


class GaussianPolicy(torch.nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh())
        self.mean = torch.nn.Linear(hidden, 1)
        self.std = torch.nn.Linear(hidden, 1)

    def forward(self, s):
        h = self.body(s)
        return torch.tanh(self.mean(h)), F.softplus(self.std(h))


policy = GaussianPolicy()
optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
for step in range(600):
    mean, std = policy(states)
    var = std.pow(2)
    log_likelihood = -(actions - mean).pow(2) / (2 * var) - std.log()
    loss = -log_likelihood.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 200 == 0:
        print(f"step {step} loss {loss.item():.4f} std {std.min().item():.3g}")
