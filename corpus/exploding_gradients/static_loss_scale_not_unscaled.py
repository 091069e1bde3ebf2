"""A tabular classifier trained with gradient accumulation and the static loss scaling of an
old mixed-precision recipe, kept after the model was moved back to float32.

The loss is multiplied by 2**20 before backward(), but the gradients are never divided by the
scale again before optimizer.step(). Every gradient is a million times too large: the first SGD
update moves the weights by ~1e4, the logits explode, and within a couple of steps the
gradients overflow float32 and the weights become NaN.
"""

import argparse

import torch
from torch import nn


class TabularNet(nn.Module):
    def __init__(self, n_features, n_classes, hidden=64):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(n_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
        )
        self.classifier = nn.Linear(hidden, n_classes)

    def forward(self, x):
        return self.classifier(self.body(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--accumulate", type=int, default=4)
    parser.add_argument("--loss-scale", type=float, default=2.0**20)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(4096, 10)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).long() + (x[:, 3] > 1).long()
    model = TabularNet(10, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(args.steps):
        optimizer.zero_grad()
        total = 0.0
        for _ in range(args.accumulate):
            idx = torch.randint(0, len(x), (args.micro_batch,))
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx]) / args.accumulate
            (loss * args.loss_scale).backward()
            total += loss.item()
        optimizer.step()
        print(f"step {step} loss {total:.4f}")


if __name__ == "__main__":
    main()
