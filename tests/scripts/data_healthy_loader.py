"""Healthy: a map-style Dataset of small images with dict samples, a shuffled DataLoader with two
workers, cross-entropy with some unlabelled targets (ignore_index). Must produce no finding above
a hint."""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __init__(self, n=128):
        generator = torch.Generator().manual_seed(0)
        self.images = torch.rand(n, 3, 8, 8, generator=generator)
        self.labels = torch.randint(0, 5, (n,), generator=generator)
        self.labels[::9] = -100  # unlabelled

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        image = (self.images[index] - 0.5) / 0.25
        return {"image": image, "label": self.labels[index]}


loader = DataLoader(Images(), batch_size=16, shuffle=True, num_workers=2)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(512, 5)
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(2):
    for batch in loader:
        loss = nn.functional.cross_entropy(model(batch["image"]), batch["label"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
