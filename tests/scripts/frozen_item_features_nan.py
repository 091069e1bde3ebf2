"""Planted bug: precomputed item features, one of them missing (NaN), are frozen into an
embedding table the recommender looks items up in. The table is never trained, so the first
batch that looks that item up makes a NaN score."""

import torch
from torch import nn

torch.manual_seed(0)
features = torch.randn(50, 8)
features[37, 2] = float("nan")  # a descriptor the feature extractor could not compute


class Recommender(nn.Module):
    def __init__(self, item_features):
        super().__init__()
        self.items = nn.Embedding.from_pretrained(item_features, freeze=True)
        self.users = nn.Embedding(20, 8)
        self.project = nn.Linear(8, 8)

    def forward(self, users, items):
        return (self.users(users) * self.project(self.items(items))).sum(-1)


model = Recommender(features)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(20):
    users, items = torch.randint(0, 20, (16,)), torch.randint(0, 37, (16,))
    if step >= 5:
        items[0] = 37 + (step - 5) % 13  # the later items join the catalogue at step 5
    loss = nn.functional.softplus(-model(users, items)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
