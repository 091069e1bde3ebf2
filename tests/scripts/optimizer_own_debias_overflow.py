"""Planted bug: a normalized-momentum optimizer pasted into the project corrects its momentum's
bias by dividing by `beta ** t` where the paper divides by `1 - beta ** t`. The update is
normalized, so training goes on normally while beta ** t decays towards 0; once the quotient
passes float32's largest value it is inf, and inf / inf in the normalization is NaN."""

import torch
from torch import nn


class NormalizedMomentum(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, beta=0.6):
        super().__init__(params, dict(lr=lr, beta=beta))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            group["t"] = group.get("t", 0) + 1
            beta = group["beta"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["m"] = torch.zeros_like(p)
                m = state["m"]
                m.mul_(beta).add_(p.grad, alpha=1 - beta)
                m_hat = m.div(beta ** group["t"])  # the line to fix
                p.add_(m_hat / m_hat.abs().max().clamp_min(1e-12), alpha=-group["lr"])


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = NormalizedMomentum(model.parameters())
inputs = torch.randn(256, 16)
targets = inputs[:, :3].sum(dim=1, keepdim=True)
for step in range(300):
    loss = ((model(inputs) - targets) ** 2).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 20 == 0:
        print(f"step {step} loss {loss.item():.4f}")
