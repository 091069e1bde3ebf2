"""Planted bug: an AdaDelta pasted into the project (it has no learning rate: the step size is
its own sqrt(E[dx^2]) / sqrt(E[g^2])) sums the squared updates instead of averaging them,
`sum_dx.add_(update * update)`. The step grows by a constant factor each step until that sum
overflows float32. No learning rate exists to lower: the update rule is the bug."""

import torch
from torch import nn


class AdaDelta(torch.optim.Optimizer):
    def __init__(self, params, rho=0.9, eps=1e-6):
        super().__init__(params, dict(rho=rho, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            rho, eps = group["rho"], group["eps"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["avg_g"] = torch.zeros_like(p)
                    state["sum_dx"] = torch.zeros_like(p)
                avg_g, sum_dx = state["avg_g"], state["sum_dx"]
                avg_g.mul_(rho).addcmul_(p.grad, p.grad, value=1 - rho)
                update = (sum_dx + eps).sqrt() / (avg_g + eps).sqrt() * p.grad
                sum_dx.add_(update * update)  # the line to fix
                p.sub_(update)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
optimizer = AdaDelta(model.parameters())
inputs = torch.randn(128, 8)
labels = (inputs[:, 0] > 0).long()
for step in range(400):
    loss = nn.functional.cross_entropy(model(inputs), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 20 == 0:
        print(f"step {step} loss {loss.item():.4f}")
