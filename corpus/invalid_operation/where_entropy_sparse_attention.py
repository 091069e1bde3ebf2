"""Attention pooling over a set of item features with ReLU-normalized ("sparse") attention
weights and an entropy bonus that keeps the attention from collapsing.

The entropy is written as sum(where(p > 0, p * log(p), 0)) to skip the zero weights. The
forward value is fine, but torch.where only masks the forward: for p = 0 the unused branch
still holds 0 * log(0) = NaN and the backward pass multiplies a zero gradient by log(0) = -inf,
which is NaN. The usual fix is the double where: log(where(p > 0, p, 1)).
"""

import torch
import torch.nn.functional as F
from torch import nn


class SparseAttentionPool(nn.Module):
    def __init__(self, d_in=12, d_hidden=32):
        super().__init__()
        self.proj = nn.Linear(d_in, d_hidden)
        self.score = nn.Linear(d_hidden, 1)
        self.out = nn.Linear(d_hidden, 1)

    def forward(self, items):
        h = torch.tanh(self.proj(items))
        s = F.relu(self.score(h)).squeeze(-1)
        p = s / (s.sum(dim=1, keepdim=True) + 1e-6)
        pooled = (p.unsqueeze(-1) * h).sum(dim=1)
        return self.out(pooled).squeeze(-1), p


def entropy(p):
    plogp = torch.where(p > 0, p * torch.log(p), torch.zeros_like(p))
    return -plogp.sum(dim=1).mean()


def make_sets(n=512, set_size=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    items = torch.randn(n, set_size, 12, generator=g)
    target = items[:, :, 0].max(dim=1).values
    return items, target


items, target = make_sets()
torch.manual_seed(0)
model = SparseAttentionPool()
optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
for epoch in range(5):
    for start in range(0, len(items), 64):
        pred, p = model(items[start : start + 64])
        mse = F.mse_loss(pred, target[start : start + 64])
        loss = mse - 0.01 * entropy(p)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} mse {mse.item():.4f} loss {loss.item():.4f}")
