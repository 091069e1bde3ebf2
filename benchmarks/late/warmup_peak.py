"""Linear warm-up over --fail-at steps to a peak learning rate too high for this model (SGD on
this regression trains up to about lr 0.25): the loss diverges near the end of the warm-up."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--fail-at", type=int, default=300)
args = parser.parse_args()

torch.manual_seed(0)
x = torch.randn(256, 16)
y = x @ torch.randn(16, 1)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.27)
schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / args.fail_at))
for step in range(args.fail_at * 2):
    batch = torch.randint(0, 256, (32,))
    loss = nn.functional.mse_loss(model(x[batch]), y[batch])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    schedule.step()
    if not torch.isfinite(loss):  # the script stops at the first non-finite loss
        print(f"step {step} loss {loss.item()}: stopping")
        break
    if step % 1000 == 0:
        print(f"step {step} loss {loss.item():.4f}")
