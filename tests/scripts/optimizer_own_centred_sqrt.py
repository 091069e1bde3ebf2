"""Planted bug: a centred RMSProp pasted into the project adds eps outside the square root,
`(n - g * g).sqrt() + eps`. A weight whose gradient is the same every step (the L1 penalty of
a feature that is always 0) has n - g*g = 0 in exact arithmetic, which float32 rounds slightly
below 0 after a hundred-odd steps: sqrt of a negative number is NaN."""

import torch
from torch import nn


class CentredRMSProp(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-4, alpha=0.9, eps=1e-4):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            alpha, eps = group["alpha"], group["eps"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state["n"] = torch.zeros_like(p)
                    state["g"] = torch.zeros_like(p)
                n, g = state["n"], state["g"]
                n.mul_(alpha).addcmul_(p.grad, p.grad, value=1 - alpha)
                g.mul_(alpha).add_(p.grad, alpha=1 - alpha)
                denom = (n - g * g).sqrt() + eps  # the line to fix
                p.addcdiv_(p.grad, denom, value=-group["lr"])


torch.manual_seed(0)
model = nn.Linear(256, 1)
optimizer = CentredRMSProp(model.parameters())
features = torch.randn(512, 256)
features[:, 192:] = 0.0  # levels that never occur: only the L1 penalty moves their weights
penalty = torch.rand(1, 256) * 1e-3  # adaptive lasso: a penalty per feature
targets = features[:, :4].sum(dim=1, keepdim=True)
for step in range(200):
    loss = ((model(features) - targets) ** 2).mean() + (penalty * model.weight.abs()).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 20 == 0:
        print(f"step {step} loss {loss.item():.4f}")
