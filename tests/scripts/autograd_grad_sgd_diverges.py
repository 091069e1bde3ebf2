"""Planted bug: a functional training loop (a port of JAX code) takes its gradients from
`torch.autograd.grad` and updates the weights by hand, with a step size too large for its
summed loss: the weights grow each update until the loss is inf, then nan."""

import torch

torch.manual_seed(0)
step_size = 0.05  # the line to fix
w1 = (torch.randn(16, 32) * 0.3).requires_grad_()
w2 = (torch.randn(32, 1) * 0.3).requires_grad_()
x = torch.randn(128, 16)
y = x[:, :1] * 2.0 + x[:, 1:2]
for step in range(40):
    loss = ((torch.relu(x @ w1) @ w2 - y) ** 2).sum()
    g1, g2 = torch.autograd.grad(loss, [w1, w2])
    with torch.no_grad():
        w1 -= step_size * g1
        w2 -= step_size * g2
    print(f"step {step} loss {loss.item():.4g}")
