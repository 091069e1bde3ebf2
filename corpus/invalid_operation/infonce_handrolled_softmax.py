"""Contrastive (SimCLR-style) pre-training of a small encoder with an InfoNCE loss whose
softmax is written out by hand: exp(similarity / temperature) / sum(...).

The similarities are cosines in [-1, 1] and the temperature is 0.01, so the exponent reaches
100. exp(100) = 2.7e43 does not fit in float32 (max 3.4e38): the numerator and the row sum
are inf and inf / inf = NaN. The math is fine; the float32 range is not. F.cross_entropy on
similarity / temperature (log-sum-exp) computes the same loss stably.
"""

import torch
import torch.nn.functional as F
from torch import nn


def augment(x, generator):
    return x + 0.1 * torch.randn(x.shape, generator=generator)


def info_nce(z1, z2, temperature=0.01):
    z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    sim = z1 @ z2.t()
    e = torch.exp(sim / temperature)
    positives = e.diagonal()
    return -torch.log(positives / e.sum(dim=1)).mean()


torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
data = torch.randn(2048, 32)
encoder = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 64))
optimizer = torch.optim.AdamW(encoder.parameters(), lr=1e-3, weight_decay=1e-4)
for epoch in range(2):
    perm = torch.randperm(len(data))
    for i in range(0, len(data), 128):
        batch = data[perm[i : i + 128]]
        loss = info_nce(encoder(augment(batch, gen)), encoder(augment(batch, gen)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % 512 == 0:
            print(f"epoch {epoch} step {i // 128} loss {loss.item():.4f}")
