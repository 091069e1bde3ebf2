"""Quadratic regression of thefts on fires (CS 20SI lecture 3 exercise) with lr 1e-3.

Reproduces https://github.com/chiphuyen/stanford-tensorflow-tutorials/issues/54: extending the
linear fire/theft regression of 03_linear_regression_sol.py to Y = w*X^2 + u*X + b and keeping the
lecture's learning rate of 0.001 makes the loss and parameters grow until they are inf/nan.  With
X up to ~40 fires per 1000 housing units the X^2 feature is ~1600, so per-sample SGD with lr 1e-3
overshoots by orders of magnitude every step.  As the reporter concluded, the learning rate is the
cause: a learning rate of 1e-7 trains the quadratic model.

Fix: lower CONFIG["learning_rate"] (1e-7 trains).
"""
import numpy as np
import torch
import torch.nn as nn

CONFIG = {
    "n_epochs": 50,
    "learning_rate": 1e-3,
    "seed": 54,
}


def load_fire_theft(rng, n=42):
    """Stand-in for slr05.xls: fires and thefts per 1000 housing units in 42 Chicago zip codes."""
    fires = rng.uniform(2.0, 40.0, size=n)
    thefts = 1.7 * fires + 16.0 + rng.normal(0.0, 8.0, size=n)
    return fires.astype(np.float32), thefts.astype(np.float32)


class Quadratic(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(()))
        self.u = nn.Parameter(torch.zeros(()))
        self.b = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return self.w * x * x + self.u * x + self.b


def main(cfg):
    rng = np.random.default_rng(cfg["seed"])
    torch.manual_seed(cfg["seed"])
    fires, thefts = load_fire_theft(rng)
    X, Y = torch.from_numpy(fires), torch.from_numpy(thefts)

    model = Quadratic()
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg["learning_rate"])
    for epoch in range(cfg["n_epochs"]):
        total = 0.0
        for x, y in zip(X, Y):                  # one sample at a time, as in the lecture code
            loss = (y - model(x)) ** 2
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        if epoch % 5 == 0 or epoch == cfg["n_epochs"] - 1:
            print(f"Epoch {epoch}: {total / len(X)}   w={model.w.item():.4g} u={model.u.item():.4g} b={model.b.item():.4g}")


if __name__ == "__main__":
    main(CONFIG)
