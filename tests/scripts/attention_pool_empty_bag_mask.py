"""Attention pooling over padded bags of instances; a few bags hold no instance at all.

Padding is masked with -inf before the softmax, so a bag whose every slot is padding has a
score row that is entirely -inf: softmax gives 0/0 = NaN for it, and the loss is NaN from the
first batch that holds an empty bag. The fix is the mask's constant: the dtype's most negative
finite value gives such a row equal weights (over zero vectors) instead of NaN.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
BAGS, SLOTS, DIM = 256, 6, 8
sizes = torch.randint(1, SLOTS + 1, (BAGS,))
sizes[torch.arange(BAGS) % 37 == 36] = 0  # a few bags came out empty after filtering
instances = torch.randn(BAGS, SLOTS, DIM)
present = torch.arange(SLOTS)[None, :] < sizes[:, None]
instances = instances * present[..., None]
labels = (instances.sum(dim=(1, 2)) > 0).float()


class AttentionPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.score = nn.Linear(DIM, 1)
        self.head = nn.Linear(DIM, 1)

    def forward(self, x, present):
        scores = self.score(x).squeeze(-1)
        scores = scores.masked_fill(~present, float("-inf"))
        weights = F.softmax(scores, dim=-1)
        pooled = (weights.unsqueeze(-1) * x).sum(dim=1)
        return self.head(pooled).squeeze(-1)


model = AttentionPool()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(3):
    for start in range(0, BAGS, 16):
        x, m, y = (
            instances[start : start + 16],
            present[start : start + 16],
            labels[start : start + 16],
        )
        loss = F.binary_cross_entropy_with_logits(model(x, m), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
