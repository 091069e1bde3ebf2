"""Metric learning with a triplet loss on 2-D blobs; the Euclidean distance is written by hand.

Positives are drawn from the anchor's class with replacement, so now and then the positive
*is* the anchor. Its distance is sqrt(0) = 0, a finite forward pass, but the derivative of
sqrt at 0 is infinite: the backward pass computes 0 * inf = NaN and every weight gets a NaN
gradient. Adding an epsilon under the sqrt (or using F.pairwise_distance) fixes it.
"""

import torch
from torch import nn


class EmbeddingNet(nn.Module):
    def __init__(self, d_in=10, d_out=4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, 64), nn.ReLU(), nn.Linear(64, d_out))

    def forward(self, x):
        return self.body(x)


def euclidean(a, b):
    return torch.sqrt(((a - b) ** 2).sum(dim=1))


def sample_triplets(labels, n, generator):
    anchors = torch.randint(0, len(labels), (n,), generator=generator)
    positives, negatives = [], []
    for a in anchors.tolist():
        same = (labels == labels[a]).nonzero().squeeze(1)
        other = (labels != labels[a]).nonzero().squeeze(1)
        positives.append(same[torch.randint(0, len(same), (1,), generator=generator)])
        negatives.append(other[torch.randint(0, len(other), (1,), generator=generator)])
    return anchors, torch.cat(positives), torch.cat(negatives)


def train(steps=30, margin=1.0):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(8).repeat_interleave(6)
    centers = torch.randn(8, 10) * 3
    points = centers[labels] + torch.randn(len(labels), 10)
    model = EmbeddingNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        a, p, n = sample_triplets(labels, 32, gen)
        za, zp, zn = model(points[a]), model(points[p]), model(points[n])
        loss = torch.relu(euclidean(za, zp) - euclidean(za, zn) + margin).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} triplet loss {loss.item():.4f}")


if __name__ == "__main__":
    train()
