"""Planted bug: a map-style Dataset normalizes each sample's mask by its maximum; some masks are
all zero, so 0/0 makes NaN inside `__getitem__`, in a DataLoader worker (num_workers=2)."""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Segments(Dataset):
    def __init__(self, n=96):
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(n, 1, 8, 8, generator=generator)
        self.masks = (torch.rand(n, 1, 8, 8, generator=generator) > 0.5).float()
        self.masks[::23] = 0.0  # a few samples with nothing to segment

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        mask = self.masks[index]
        weights = mask / mask.max()  # all-zero mask: 0/0
        return {"image": self.images[index], "mask": mask, "weights": weights}


loader = DataLoader(Segments(), batch_size=8, shuffle=True, num_workers=2)
model = nn.Conv2d(1, 1, 3, padding=1)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

for batch in loader:
    logits = model(batch["image"])
    per_pixel = nn.functional.binary_cross_entropy_with_logits(
        logits, batch["mask"], reduction="none"
    )
    loss = (per_pixel * batch["weights"]).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
