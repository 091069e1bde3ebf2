"""Minimising the 2-D "flower" test function with L-BFGS and no line search.

A small optimiser-comparison script (the kind used in blog posts that pit
Adam / SGD / L-BFGS against each other on toy loss landscapes).  The loss is
a * ||x|| + b * sin(c * atan2(x2, x1)), started at (20, 20).

torch.optim.LBFGS is constructed without `line_search_fn`, so every inner
iteration after the first takes the raw quasi-Newton step with lr=1.  Near
the flower's petals the curvature pairs become badly conditioned, one step
throws the point to (-1949, -1773), and the following steps keep
overshooting until the coordinates reach ~1e20 and the loss overflows to
inf.

Reproduces https://github.com/mlverse/torch/issues/516 (L-BFGS without line
search on the flower function: "loss will be Inf thereafter", while the
Python run with line search converges).  Fix adopted by the maintainers:
use the strong-Wolfe line search, i.e.
LBFGS(..., line_search_fn="strong_wolfe").
"""
import argparse
import math

import torch
from torch import nn


class Flower(nn.Module):
    def __init__(self, start, a=1.0, b=1.0, c=4.0):
        super().__init__()
        self.x = nn.Parameter(torch.tensor(start, dtype=torch.float32))
        self.a, self.b, self.c = a, b, c

    def forward(self):
        x1, x2 = self.x[0], self.x[1]
        radius = torch.sqrt(x1 ** 2 + x2 ** 2)
        return self.a * radius + self.b * torch.sin(self.c * torch.atan2(x2, x1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--inner-iters", type=int, default=5)
    parser.add_argument("--start", type=float, nargs=2, default=[20.0, 20.0])
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Flower(args.start)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=args.inner_iters)

    def closure():
        optimizer.zero_grad()
        loss = model()
        loss.backward()
        return loss

    best = math.inf
    for step in range(args.steps):
        loss = optimizer.step(closure)
        best = min(best, loss.item())
        x1, x2 = model.x.detach().tolist()
        print(f"step {step:3d}  loss {loss.item():.6f}  x = ({x1:.4f}, {x2:.4f})")

    with torch.no_grad():
        final = model().item()
    print(f"final loss {final:.6f}  best seen {best:.6f}")


if __name__ == "__main__":
    main()
