"""A small classifier whose loss turns NaN: try `nandoctor run examples/train_nan.py`.

The model normalizes its hidden features with a hand-written RMS norm that has no epsilon.
Rows whose features are all zero after the ReLU give 0/0 = NaN, which reaches the loss.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class RMSNorm(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))

    def forward(self, x):
        rms = x.pow(2).mean(dim=-1, keepdim=True).sqrt()
        return self.scale * x / rms


class Classifier(nn.Module):
    def __init__(self, features, hidden, classes):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), RMSNorm(hidden))
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.encoder(x))


def make_data(samples, features, classes):
    x = torch.randn(samples, features)
    x[::7] = -x[::7].abs()  # some samples with every feature negative
    y = torch.randint(0, classes, (samples,))
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()

    torch.manual_seed(0)
    loader = DataLoader(make_data(512, 8, 4), batch_size=64, shuffle=True)
    model = Classifier(8, 16, 4)
    with torch.no_grad():  # a "bias trick" meant to keep units sparse at the start
        model.encoder[0].weight.abs_()
        model.encoder[0].bias.fill_(-0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
