"""Planted bug: an optimizer pasted into the project adds eps after inverting the second
moment, `v.rsqrt() + eps`: a weight whose gradient is exactly 0 (an embedding row no batch
used) gets 1/sqrt(0) = inf, and 0 * inf = NaN in its update."""

import torch
from torch import nn


class AdamLike(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                m, v = state["m"], state["v"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                inverse = v.rsqrt().add_(group["eps"])  # the line to fix
                p.add_(m * inverse, alpha=-group["lr"])


torch.manual_seed(0)
embedding = nn.EmbeddingBag(100, 8, mode="mean")
head = nn.Linear(8, 2)
optimizer = AdamLike([*embedding.parameters(), *head.parameters()], lr=1e-2)
for step in range(10):
    words = torch.randint(0, 50, (16, 6))  # rows 50..99 never get a gradient
    labels = (words.sum(dim=1) % 2).long()
    loss = nn.functional.cross_entropy(head(embedding(words)), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
