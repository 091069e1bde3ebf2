"""Matrix-factorization recommender trained on rating records.

Some records come from users who opened an item but never rated it; the export writes their
rating as NaN. The Dataset turns each record into tensors without filtering, so NaN targets
reach the MSE loss.
"""

import random

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

N_USERS, N_ITEMS = 50, 40


def export_records(n=1500, seed=0):
    rnd = random.Random(seed)
    records = []
    for _ in range(n):
        user, item = rnd.randrange(N_USERS), rnd.randrange(N_ITEMS)
        rating = float("nan") if rnd.random() < 0.03 else float(rnd.randint(1, 5))
        records.append({"user": user, "item": item, "rating": rating})
    return records


class Ratings(Dataset):
    def __init__(self, records):
        self.records = records

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        r = self.records[i]
        rating = torch.tensor(r["rating"], dtype=torch.float32)
        return torch.tensor(r["user"]), torch.tensor(r["item"]), rating


class MF(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.users = nn.Embedding(N_USERS, dim)
        self.items = nn.Embedding(N_ITEMS, dim)
        self.bias = nn.Parameter(torch.tensor(3.0))

    def forward(self, u, i):
        return (self.users(u) * self.items(i)).sum(-1) + self.bias


torch.manual_seed(0)
loader = DataLoader(Ratings(export_records()), batch_size=128, shuffle=True)
model = MF()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
for epoch in range(3):
    for u, i, r in loader:
        loss = nn.functional.mse_loss(model(u, i), r)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} last-batch mse {loss.item():.3f}")
