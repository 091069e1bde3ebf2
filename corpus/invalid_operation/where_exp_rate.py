"""Count regression with a "smooth positive" link: exp(x) for x <= 0, 1 + x above.

Reported in pytorch/pytorch#68425 ("`torch.where` produces nan in backward pass for
differentiable forward pass", https://github.com/pytorch/pytorch/issues/68425):
``torch.where(a <= 0, torch.exp(a), 1 + a)`` is fine in the forward pass, but for a = 100 the
gradient is nan, because exp(100) = inf in the branch that is *not* selected and its gradient
(inf) is multiplied by the zero mask: inf * 0 = NaN.  The maintainers' answer (see also #23395)
is that torch.where differentiates both branches; make the unused branch safe.

Here the link turns the network output into a Poisson rate.  Early on all pre-activations are
small; as the model learns the busy evening hours (counts up to ~300) some pre-activations climb past
~88, exp overflows in the unselected branch and the next backward is NaN.  Fix: feed the exp
branch a clamped input, ``torch.exp(torch.clamp(x, max=0.0))``.
"""
import argparse

import torch
import torch.nn as nn


def positive_link(x):
    return torch.where(x <= 0, torch.exp(x), 1 + x)


class RateModel(nn.Module):
    def __init__(self, n_in):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_in, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return positive_link(self.net(x).squeeze(-1))


def make_data(n=2048, seed=0):
    g = torch.Generator().manual_seed(seed)
    hour = torch.rand(n, generator=g) * 24
    weekday = torch.randint(0, 7, (n,), generator=g).float()
    feats = torch.stack([torch.sin(hour / 24 * 6.283), torch.cos(hour / 24 * 6.283),
                         weekday / 6, (weekday >= 5).float()], dim=1)
    lam = 5 + 300 * torch.exp(-((hour - 17.5) ** 2) / 3.0) * (weekday < 5).float()
    return feats, torch.poisson(lam, generator=g)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=2e-2)
    args = parser.parse_args()
    torch.manual_seed(0)

    x, counts = make_data()
    model = RateModel(x.shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        perm = torch.randperm(len(x))
        running = 0.0
        for i in range(0, len(x), 128):
            idx = perm[i:i + 128]
            rate = model(x[idx])
            loss = (rate - counts[idx] * torch.log(rate)).mean()       # Poisson NLL
            opt.zero_grad()
            loss.backward()
            opt.step()
            running += loss.item()
        print(f"epoch {epoch:2d}  poisson_nll {running / (len(x) // 128):.4f}  "
              f"max rate {rate.max().item():.1f}")


if __name__ == "__main__":
    main()
