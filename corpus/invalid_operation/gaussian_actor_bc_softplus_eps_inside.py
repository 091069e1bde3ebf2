"""Behaviour-cloning warm start of a DeepRL-style Gaussian actor from bang-bang demonstrations.

The actor predicts a tanh-gated mean and a state-dependent standard deviation
``std = F.softplus(self.action_std(phi) + 1e-5)`` with ``log_std = std.log()``, and is trained by
maximising the Gaussian log-density of the expert actions.

Bug: the 1e-5 that is supposed to keep the standard deviation away from zero is added *inside*
the softplus, so it protects nothing.  The expert is a bang-bang controller whose actions are
exactly +-1, the tanh-gated mean reaches +-1.0 exactly in float32, and from then on the NLL keeps
pushing the std pre-activation down at a constant Adam step.  std shrinks to ~1e-20, std**2
underflows to 0, the log-density becomes 0/0 and the loss and all parameters turn NaN (between
iterations 1050 and 1075).

Report: https://github.com/ShangtongZhang/DeepRL/pull/4 ("moving epsilon outside softplus":
softplus(x + 1e-5) can still be 0 and its log -inf; merged by the maintainer as a bug fix).
Fix: std = F.softplus(self.action_std(phi)) + 1e-5 -- the epsilon outside the softplus.
"""
import argparse
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class GaussianActorNet(nn.Module):
    def __init__(self, state_dim, action_dim, hidden_size=64, action_gate=torch.tanh, action_scale=1.0):
        super().__init__()
        self.fc1 = nn.Linear(state_dim, hidden_size)
        self.fc2 = nn.Linear(hidden_size, hidden_size)
        self.action_mean = nn.Linear(hidden_size, action_dim)
        self.action_std = nn.Linear(hidden_size, action_dim)
        self.action_gate = action_gate
        self.action_scale = action_scale

    def forward(self, x):
        phi = torch.tanh(self.fc1(x))
        phi = torch.tanh(self.fc2(phi))
        mean = self.action_scale * self.action_gate(self.action_mean(phi))
        std = F.softplus(self.action_std(phi) + 1e-5)
        log_std = std.log()
        return mean, std, log_std

    def log_density(self, x, mean, log_std, std):
        var = std.pow(2)
        log_density = -(x - mean).pow(2) / (2 * var) - 0.5 * np.log(2 * np.pi) - log_std
        return log_density.sum(1)


def record_demonstrations(path, n_episodes=64, horizon=64, seed=0):
    """Roll out an energy-pumping (bang-bang) controller on a noisy point-mass and save it."""
    rng = np.random.RandomState(seed)
    states, actions = [], []
    for _ in range(n_episodes):
        s = rng.randn(4).astype(np.float32)
        for _ in range(horizon):
            a = np.sign(s[1] + 1e-3).astype(np.float32)
            states.append(s.copy())
            actions.append([a])
            s[0] += 0.1 * s[1]
            s[1] += 0.1 * a - 0.05 * s[0] + 0.3 * rng.randn()
            s[2:] = 0.9 * s[2:] + 0.1 * rng.randn(2)
    np.savez(path, states=np.asarray(states, np.float32), actions=np.asarray(actions, np.float32))


class DemoDataset(Dataset):
    def __init__(self, path):
        data = np.load(path)
        self.states = torch.from_numpy(data["states"])
        self.actions = torch.from_numpy(data["actions"])

    def __len__(self):
        return len(self.states)

    def __getitem__(self, i):
        return self.states[i], self.actions[i]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=1500)
    parser.add_argument("--log-every", type=int, default=25)
    args = parser.parse_args()

    torch.manual_seed(0)
    np.random.seed(0)

    path = os.path.join(tempfile.mkdtemp(), "demos.npz")
    record_demonstrations(path)
    loader = DataLoader(DemoDataset(path), batch_size=args.batch_size, shuffle=True, drop_last=True)

    actor = GaussianActorNet(state_dim=4, action_dim=1)
    optimizer = torch.optim.Adam(actor.parameters(), lr=args.lr)

    it = 0
    while it < args.iterations:
        for states, actions in loader:
            mean, std, log_std = actor(states)
            loss = -actor.log_density(actions, mean, log_std, std).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            it += 1
            if it % args.log_every == 0:
                print(f"iter {it:5d}  bc nll {loss.item():.4f}  mean std {std.mean().item():.3e}")
            if it >= args.iterations:
                break


if __name__ == "__main__":
    main()
