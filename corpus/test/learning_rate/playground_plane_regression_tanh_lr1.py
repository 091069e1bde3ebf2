"""Re-creation of a TensorFlow-Playground run in PyTorch: the "plane" regression
data set (inputs x, y in [-6, 6], target a noisy linear function of x + y), one
hidden layer of 8 tanh units, linear output, batch size 1, plain SGD with the
learning-rate slider at 1.

Reproduces https://github.com/tensorflow/playground/issues/3 : with these
settings the network output and all neurons turn NaN (here the loss grows by
orders of magnitude every few single-sample steps and is NaN from
iteration 39 on).  The
maintainer explained that it is expected: the output of a regression net is
unbounded, so with a learning rate this high the network escapes the stable
region and diverges; "LR < 0.3 seems to work".  Fix: a smaller learning rate
(e.g. 0.03, the playground default).
"""
import argparse

import numpy as np
import torch
import torch.nn as nn


def regress_plane(num_samples, noise, rng):
    radius = 6.0

    def label(x, y):                       # scale [-10, 10] -> [-1, 1]
        return (x + y) / 10.0

    pts = []
    for _ in range(num_samples):
        x = rng.uniform(-radius, radius)
        y = rng.uniform(-radius, radius)
        nx = rng.uniform(-radius, radius) * noise
        ny = rng.uniform(-radius, radius) * noise
        pts.append((x, y, label(x + nx, y + ny)))
    return np.array(pts, dtype=np.float32)


class PlaygroundNet(nn.Module):
    def __init__(self, hidden=8):
        super().__init__()
        self.hidden = nn.Linear(2, hidden)
        self.out = nn.Linear(hidden, 1)
        for layer in (self.hidden, self.out):     # playground: U(-0.5, 0.5), bias 0.1
            nn.init.uniform_(layer.weight, -0.5, 0.5)
            nn.init.constant_(layer.bias, 0.1)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--learning-rate", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--noise", type=float, default=0.5)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.manual_seed(args.seed)
    rng = np.random.RandomState(args.seed)
    data = regress_plane(500, args.noise, rng)
    rng.shuffle(data)
    train, test = torch.from_numpy(data[:250]), torch.from_numpy(data[250:])

    net = PlaygroundNet()
    opt = torch.optim.SGD(net.parameters(), lr=args.learning_rate)

    def loss_on(d):
        with torch.no_grad():
            return 0.5 * ((net(d[:, :2]).squeeze(1) - d[:, 2]) ** 2).mean().item()

    it = 0
    for epoch in range(args.epochs):
        for i in range(0, len(train), args.batch_size):
            b = train[i:i + args.batch_size]
            opt.zero_grad()
            loss = 0.5 * ((net(b[:, :2]).squeeze(1) - b[:, 2]) ** 2).mean()
            loss.backward()
            opt.step()
            it += 1
            if it <= 100 and it % 10 == 0:      # the playground's live loss readout
                print(f"iter {it:4d}  batch loss {loss.item():.4f}  training loss {loss_on(train):.4f}")
        print(f"epoch {epoch:3d}  training loss {loss_on(train):.4f}  test loss {loss_on(test):.4f}")


if __name__ == "__main__":
    main()
