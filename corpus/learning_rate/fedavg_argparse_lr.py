"""Federated averaging on a FedProx-style synthetic benchmark with a too-large default lr.

Reproduces https://github.com/CharlieDinh/pFedMe/issues/11 ("why train loss will be nan?"); the
maintainer's answer: "the training loss is nan when the learning rate is large".  Each client runs
a few local SGD epochs of a small 3-layer DNN on its own non-IID synthetic data (feature j has variance
j^-1.2, client means shifted), the server averages the weights.  With --learning_rate 1.0 the
local updates overshoot, the averaged weights grow every round and the cross-entropy becomes
nan by round 3; 0.05 trains.

Fix: a smaller learning rate (default 0.05).
"""
import argparse
import copy

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--num_users", type=int, default=10)
    p.add_argument("--num_global_iters", type=int, default=30)
    p.add_argument("--local_epochs", type=int, default=5)
    p.add_argument("--batch_size", type=int, default=20)
    p.add_argument("--learning_rate", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=11)
    return p.parse_args()


def synthetic_clients(num_users, rng, dim=60, classes=10, alpha=0.5, beta=0.5):
    cov = np.diag(np.arange(1, dim + 1) ** -1.2)
    clients = []
    for _ in range(num_users):
        n = int(rng.integers(80, 200))
        W = rng.normal(rng.normal(0, alpha), 1, (dim, classes))
        b = rng.normal(rng.normal(0, alpha), 1, classes)
        mean = rng.normal(rng.normal(0, beta), 1, dim)
        x = rng.multivariate_normal(mean, cov, n)
        y = np.argmax(x @ W + b, axis=1)
        clients.append((torch.tensor(x, dtype=torch.float32), torch.tensor(y)))
    return clients


class DNN(nn.Module):
    def __init__(self, dim=60, hidden=100, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def local_train(model, data, args, gen):
    x, y = data
    opt = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    for _ in range(args.local_epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), args.batch_size):
            idx = perm[i:i + args.batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return model.state_dict()


def main():
    args = get_args()
    rng = np.random.default_rng(args.seed)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    clients = synthetic_clients(args.num_users, rng)
    server = DNN()

    for rnd in range(args.num_global_iters):
        states, sizes = [], []
        for data in clients:
            local = copy.deepcopy(server)
            states.append(local_train(local, data, args, gen))
            sizes.append(len(data[0]))
        total = float(sum(sizes))
        avg = {k: sum(s[k] * (n / total) for s, n in zip(states, sizes)) for k in states[0]}
        server.load_state_dict(avg)

        with torch.no_grad():
            losses = [F.cross_entropy(server(x), y, reduction="sum").item() for x, y in clients]
            correct = sum((server(x).argmax(1) == y).sum().item() for x, y in clients)
        print(f"round {rnd:3d}  train loss {sum(losses) / total:.4f}  acc {correct / total:.3f}")


if __name__ == "__main__":
    main()
