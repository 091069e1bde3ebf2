"""Planted bug: labels run 1..10 (1-based, as in the source file) for a 10-way classifier. The
batches are dataclasses built by a custom collate_fn; ignore_index marks unlabelled samples."""

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

IGNORE = -100


@dataclass
class Batch:
    pixels: torch.Tensor
    label: torch.Tensor


class Digits(Dataset):
    def __init__(self, n=120):
        generator = torch.Generator().manual_seed(0)
        self.pixels = torch.randn(n, 16, generator=generator)
        self.labels = torch.randint(1, 11, (n,), generator=generator)  # 1-based labels
        self.labels[::7] = IGNORE  # unlabelled

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.pixels[index], self.labels[index]


def collate(samples):
    pixels, labels = zip(*samples, strict=True)
    return Batch(torch.stack(pixels), torch.stack(labels))


loader = DataLoader(Digits(), batch_size=16, shuffle=True, collate_fn=collate)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))
criterion = nn.CrossEntropyLoss(ignore_index=IGNORE)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for batch in loader:
    loss = criterion(model(batch.pixels), batch.label)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
