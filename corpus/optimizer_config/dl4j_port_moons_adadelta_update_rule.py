"""MLP classifier on the two-moons data, trained with a hand-written AdaDelta updater.

Port of the DL4J "MLPClassifierMoon" example to PyTorch.  The AdaDelta updater was
ported line by line from the Java updater (nd4j AdaDelta.java, 2016): the running
average of the squared gradient is computed as (rho * E[g^2] + (1 - rho)) * g^2
instead of rho * E[g^2] + (1 - rho) * g^2.  With rho < 1 the denominator then tracks
|g| itself while E[dx^2] grows by a constant factor every step, so the step size
grows geometrically until the weights overflow: the loss explodes from the first
epoch on and is nan from epoch 5 (iteration ~190).

Report: https://github.com/deeplearning4j/nd4j/issues/1239 ("Adadelta issues": the
moon MLP example diverges; works only with rho = 1).
Fix: use the update rule from the paper, E[g^2] = rho * E[g^2] + (1 - rho) * g^2.
"""
import math

import numpy as np
import torch
import torch.nn as nn
from torch.optim import Optimizer

SEED = 123
BATCH_SIZE = 50
N_EPOCHS = 15
N_HIDDEN = 20
RHO = 0.95
EPSILON = 1e-6


class AdaDelta(Optimizer):
    """AdaDelta updater (Zeiler 2012), ported from the Java updater."""

    def __init__(self, params, rho=0.95, epsilon=1e-6):
        super().__init__(params, dict(rho=rho, epsilon=epsilon))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            rho, eps = group["rho"], group["epsilon"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if not state:
                    state["msg"] = torch.zeros_like(p)   # E[g^2]
                    state["msdx"] = torch.zeros_like(p)  # E[dx^2]
                msg, msdx = state["msg"], state["msdx"]
                # running average of the squared raw gradient
                msg.copy_((rho * msg + (1 - rho)) * g * g)
                update = torch.sqrt(msdx + eps) / torch.sqrt(msg + eps) * g
                msdx.mul_(rho).add_((1 - rho) * update * update)
                p.sub_(update)


def make_moons(n, noise, rng):
    n_out = n // 2
    n_in = n - n_out
    t_out = rng.uniform(0, math.pi, n_out)
    t_in = rng.uniform(0, math.pi, n_in)
    x = np.concatenate([
        np.stack([np.cos(t_out), np.sin(t_out)], 1),
        np.stack([1 - np.cos(t_in), 1 - np.sin(t_in) - 0.5], 1),
    ])
    y = np.concatenate([np.zeros(n_out), np.ones(n_in)]).astype(np.int64)
    x += rng.normal(0, noise, x.shape)
    return x.astype(np.float32), y


def build_network(n_in, n_hidden, n_out):
    net = nn.Sequential(nn.Linear(n_in, n_hidden), nn.ReLU(), nn.Linear(n_hidden, n_out))
    for m in net:
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
    return net


def main():
    torch.manual_seed(SEED)
    rng = np.random.RandomState(SEED)
    x_train, y_train = make_moons(2000, 0.1, rng)
    x_test, y_test = make_moons(1000, 0.1, rng)
    x_train, y_train = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test, y_test = torch.from_numpy(x_test), torch.from_numpy(y_test)

    model = build_network(2, N_HIDDEN, 2)
    optimizer = AdaDelta(model.parameters(), rho=RHO, epsilon=EPSILON)
    criterion = nn.CrossEntropyLoss()

    iteration = 0
    for epoch in range(N_EPOCHS):
        perm = torch.randperm(len(x_train))
        for start in range(0, len(x_train), BATCH_SIZE):
            idx = perm[start:start + BATCH_SIZE]
            optimizer.zero_grad()
            loss = criterion(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            if iteration % 20 == 0:
                print(f"Score at iteration {iteration} is {loss.item():.6f}")
            iteration += 1
        with torch.no_grad():
            acc = (model(x_test).argmax(1) == y_test).float().mean().item()
        print(f"epoch {epoch + 1}/{N_EPOCHS}  accuracy {acc:.4f}")


if __name__ == "__main__":
    main()
