"""Planted bug: the script's `--precision` option (default "16-true") runs the whole model in
float16. Its hand-written softmax exponentiates logits above 11.1, whose exp passes float16's
maximum of 65504: inf / inf is nan. With "32-true" the same run trains."""

import argparse

import torch
from torch import nn


def softmax_cross_entropy(logits, labels):
    weights = logits.exp()
    probs = weights / weights.sum(-1, keepdim=True)
    return -probs.gather(1, labels[:, None]).log().mean()


parser = argparse.ArgumentParser()
parser.add_argument("--precision", default="16-true")  # fix here
args = parser.parse_args()
dtype = torch.float16 if args.precision.startswith("16") else torch.float32

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(dtype)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
features = (40 * torch.randn(64, 32)).to(dtype)
labels = torch.randint(0, 10, (64,))
for step in range(5):
    loss = softmax_cross_entropy(model(features), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
