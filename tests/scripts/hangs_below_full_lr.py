"""exp(100 w) overflows at step 1 at the script's learning rate; at any smaller one the run is
still finite at step 1 and then hangs (the candidates of a learning-rate sweep that never end
on their own)."""

import time

import torch

w = torch.nn.Parameter(torch.zeros(()))
optimizer = torch.optim.SGD([w], lr=1.0)
for step in range(10):
    loss = torch.exp(100 * w.detach()) - w  # w grows by lr a step: exp(100) is inf in float32
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4g}")
    if step >= 1 and torch.isfinite(loss):
        time.sleep(600)
