"""A hand-written softmax over logits whose scale grows slowly during training: exp overflows
float32 at about step --fail-at (a stable formula, log-sum-exp, is the fix)."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--fail-at", type=int, default=300)
args = parser.parse_args()

torch.manual_seed(0)
x = torch.randn(32, 8)
labels = torch.randint(0, 4, (32,))
model = nn.Linear(8, 4)
scale = nn.Parameter(torch.tensor(1.0))  # a learnable temperature, pushed up a little each step
optimizer = torch.optim.SGD([*model.parameters(), scale], lr=0.01)
growth = 100.0 / args.fail_at
for step in range(args.fail_at * 2):
    logits = model(x) * scale
    e = torch.exp(logits)
    probs = e / e.sum(dim=1, keepdim=True)
    loss = nn.functional.nll_loss(torch.log(probs + 1e-12), labels) - growth * scale
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 1000 == 0:
        print(f"step {step} loss {loss.item():.4f} scale {scale.item():.2f}")
