"""Energy-load regressor ported from an old Theano/Blocks project, keeping its Adam step rule.

The project's ``BlocksAdam`` keeps the Blocks parameterisation, where ``beta1`` and ``beta2``
are the *complements* of the paper's decay rates (Blocks defaults beta1=0.1, beta2=0.001 mean
decay 0.9 / 0.999).  When porting the config, beta2 was set to 0.999 from the Adam paper.  In
this parameterisation that makes the second-moment average keep only 0.001 of its history, so
``v`` is essentially the square of the *current* gradient while the first moment still averages
over ~10 steps.  Whenever a weight's current gradient is tiny (or exactly zero for ReLU units
that are silent on the whole batch) the step ``m / (sqrt(v) + eps)`` becomes enormous, the
weights blow up: the cost jumps from ~1 to 5e4 at iteration 5 and ~1e31 at iteration 15, the
squared error overflows to inf at iteration 17 and the cost is nan from iteration 25 on.

Reproduces: https://github.com/mila-iqia/blocks/issues/1159 ("Adam moment parameterization is
backwards": the reporter passed the customary beta2=0.999, which Blocks interprets as a decay
of 0.001, and training broke; Blocks later switched to the paper's convention).

Fix: pass the Blocks-convention value, ``beta2=0.001`` (i.e. decay 0.999); the run then trains
to a validation RMSE of about 0.21 (standardised target).
"""
import argparse
import math

import numpy as np
import torch
import torch.nn as nn


class BlocksAdam:
    """Adam step rule as in blocks.algorithms.Adam (beta = 1 - decay)."""

    def __init__(self, params, learning_rate=0.002, beta1=0.1, beta2=0.001, epsilon=1e-8):
        self.params = [p for p in params if p.requires_grad]
        self.learning_rate = learning_rate
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.mean = [torch.zeros_like(p) for p in self.params]
        self.variance = [torch.zeros_like(p) for p in self.params]
        self.time = 0

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.time += 1
        t = self.time
        lr_t = (self.learning_rate * math.sqrt(1.0 - (1.0 - self.beta2) ** t)
                / (1.0 - (1.0 - self.beta1) ** t))
        for p, mean, variance in zip(self.params, self.mean, self.variance):
            g = p.grad
            mean.mul_(1.0 - self.beta1).add_(g, alpha=self.beta1)
            variance.mul_(1.0 - self.beta2).addcmul_(g, g, value=self.beta2)
            p.sub_(lr_t * mean / (variance.sqrt() + self.epsilon))


def make_load_data(n, rng):
    """Hourly building load from weather and calendar features (standardised)."""
    hour = rng.integers(0, 24, n)
    dow = rng.integers(0, 7, n)
    temp = rng.normal(15, 8, n)
    humid = rng.uniform(20, 95, n)
    occupancy = rng.beta(2, 3, n)
    load = (40 + 0.9 * np.abs(temp - 18) ** 1.3 + 12 * occupancy * (dow < 5)
            + 8 * np.sin(np.pi * hour / 24) ** 2 + 0.05 * humid + rng.normal(0, 2.5, n))
    feats = np.stack([
        np.sin(2 * np.pi * hour / 24), np.cos(2 * np.pi * hour / 24),
        (dow >= 5).astype(float), (temp - 15) / 8, (humid - 57) / 22, occupancy * 4 - 1.6,
    ], axis=1)
    target = (load - load.mean()) / load.std()
    return torch.tensor(feats, dtype=torch.float32), torch.tensor(target, dtype=torch.float32)[:, None]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.002)
    args = parser.parse_args()

    torch.manual_seed(1234)
    rng = np.random.default_rng(1234)
    x_train, y_train = make_load_data(6000, rng)
    x_valid, y_valid = make_load_data(1000, rng)

    model = nn.Sequential(
        nn.Linear(6, 128), nn.ReLU(),
        nn.Linear(128, 128), nn.ReLU(),
        nn.Linear(128, 64), nn.ReLU(),
        nn.Linear(64, 1),
    )
    step_rule = BlocksAdam(model.parameters(), learning_rate=args.lr, beta1=0.1, beta2=0.999)

    iteration = 0
    for epoch in range(args.epochs):
        perm = torch.randperm(len(x_train))
        for i in range(0, len(x_train), args.batch_size):
            idx = perm[i:i + args.batch_size]
            cost = ((model(x_train[idx]) - y_train[idx]) ** 2).mean()
            step_rule.zero_grad()
            cost.backward()
            step_rule.step()
            if iteration % 20 == 0:
                print(f"epoch {epoch} iteration {iteration} train_cost {cost.item():.5g}")
            iteration += 1
        with torch.no_grad():
            rmse = ((model(x_valid) - y_valid) ** 2).mean().sqrt().item()
        print(f"after epoch {epoch}: valid_rmse {rmse:.4f}")


if __name__ == "__main__":
    main()
