"""A hand-written softmax over cosine logits whose scale is annealed upward, as in
normalized-softmax (CosFace/ArcFace-style) training: exp overflows float32 once the scale times
the largest cosine passes 88.7, at about step --fail-at. A stable formula (log-sum-exp,
`torch.log_softmax`) is the fix; a smaller learning rate does not move the failure."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--fail-at", type=int, default=300)
args = parser.parse_args()

torch.manual_seed(0)
x = torch.randn(64, 8)
labels = torch.randint(0, 4, (64,))
model = nn.Linear(8, 16)
classes = nn.Parameter(torch.randn(4, 16))
optimizer = torch.optim.SGD([*model.parameters(), classes], lr=0.05)
for step in range(args.fail_at * 2):
    scale = 100.0 * (step + 1) / args.fail_at  # the annealed temperature
    features = nn.functional.normalize(model(x), dim=1)
    cosine = features @ nn.functional.normalize(classes, dim=1).T
    e = torch.exp(scale * cosine)
    probs = e / e.sum(dim=1, keepdim=True)
    loss = nn.functional.nll_loss(torch.log(probs + 1e-12), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if not torch.isfinite(loss):  # the script stops at the first non-finite loss
        print(f"step {step} loss {loss.item()}: stopping")
        break
    if step % 1000 == 0:
        print(f"step {step} loss {loss.item():.4f} scale {scale:.1f}")
