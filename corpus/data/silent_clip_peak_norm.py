"""Keyword spotting on short audio clips with a 1-D CNN.

The Dataset peak-normalizes every clip by its own maximum amplitude. A few recordings are pure
silence (all zeros), so that division is 0/0 and those clips come out as NaN.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Clips(Dataset):
    def __init__(self, n=256, length=400, silent_every=50):
        g = torch.Generator().manual_seed(1)
        self.labels = torch.randint(0, 4, (n,), generator=g)
        t = torch.linspace(0, 1, length)
        freqs = 5.0 + 10.0 * self.labels.float()
        gains = 0.05 + torch.rand(n, 1, generator=g)
        self.waves = gains * torch.sin(2 * torch.pi * freqs[:, None] * t)
        self.waves += 0.01 * torch.randn(n, length, generator=g)
        self.waves[::silent_every] = 0.0  # dropped recordings: digital silence

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        wave = self.waves[i]
        wave = wave / wave.abs().max()
        return wave.unsqueeze(0), self.labels[i]


class KeywordNet(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 8, 9, stride=2),
            nn.ReLU(),
            nn.Conv1d(8, 16, 9, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool1d(1),
        )
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


torch.manual_seed(0)
loader = DataLoader(Clips(), batch_size=16, shuffle=True)
model = KeywordNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
criterion = nn.CrossEntropyLoss()
for epoch in range(2):
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 4 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
