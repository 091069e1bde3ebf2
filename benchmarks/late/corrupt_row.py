"""A corrupt (NaN) row that the shuffled sampler first draws late: NaN at about step --fail-at."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--fail-at", type=int, default=300)
args = parser.parse_args()

torch.manual_seed(0)
rows = torch.randn(4096, 16)
targets = rows[:, :1] - 0.5 * rows[:, 1:2]
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
for step in range(args.fail_at + 100):
    if step == args.fail_at:
        rows[7, 3] = float("nan")  # the log file a later epoch reads holds a corrupt reading
    batch = (
        torch.arange(step * 8, step * 8 + 8) % 4096 if step != args.fail_at else torch.arange(0, 8)
    )
    loss = nn.functional.mse_loss(model(rows[batch]), targets[batch])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if not torch.isfinite(loss):  # the script stops at the first non-finite loss
        print(f"step {step} loss {loss.item()}: stopping")
        break
    if step % 1000 == 0:
        print(f"step {step} loss {loss.item():.4f}")
