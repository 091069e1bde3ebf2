"""DB-style text detector: the threshold-map L1 loss is normalised by mask.sum().

Reported in MhLiao/DB#14 ("l1 loss may device zero", https://github.com/MhLiao/DB/issues/14):
``loss = (torch.abs(pred - gt) * mask).sum() / mask.sum()`` -- "When mask.sum() == 0 ... the
l1loss will get nan".  The author fixed it in decoders/l1_loss.py by returning a zero loss
when the mask is empty.

Here a fraction of the training crops contain no text at all; the first batch in which every
crop is blank makes the threshold loss 0/0 = NaN, and backward then writes NaN into every
weight.  Fix: ``mask_sum = mask.sum(); if mask_sum == 0: return mask_sum`` (or divide by
``mask.sum() + eps``).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class TextCrops(Dataset):
    def __init__(self, n=600, size=32, blank_ratio=0.15, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.images, self.gts, self.masks = [], [], []
        for _ in range(n):
            img = 0.1 * torch.randn(1, size, size, generator=g)
            gt = torch.zeros(1, size, size)
            mask = torch.zeros(1, size, size)
            if torch.rand(1, generator=g).item() > blank_ratio:
                y = int(torch.randint(2, size - 10, (1,), generator=g))
                x = int(torch.randint(2, size - 20, (1,), generator=g))
                img[:, y:y + 6, x:x + 16] += 1.0
                mask[:, y - 2:y + 8, x - 2:x + 18] = 1.0          # dilated border region
                gt[:, y - 2:y + 8, x - 2:x + 18] = 0.7
                gt[:, y:y + 6, x:x + 16] = 0.3
            self.images.append(img)
            self.gts.append(gt)
            self.masks.append(mask)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.gts[i], self.masks[i]


class MaskL1Loss(nn.Module):
    def forward(self, pred, gt, mask):
        loss = (torch.abs(pred - gt) * mask).sum() / mask.sum()
        return loss


class TinyDB(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
        )
        self.binarize = nn.Conv2d(16, 1, 1)
        self.thresh = nn.Conv2d(16, 1, 1)

    def forward(self, x):
        f = self.body(x)
        return torch.sigmoid(self.binarize(f)), torch.sigmoid(self.thresh(f))


def train():
    torch.manual_seed(0)
    loader = DataLoader(TextCrops(), batch_size=2, shuffle=True)
    model = TinyDB()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    l1 = MaskL1Loss()
    step = 0
    for epoch in range(2):
        for img, gt, mask in loader:
            prob, thresh = model(img)
            bce = F.binary_cross_entropy(prob, (gt > 0.25).float())
            thresh_loss = l1(thresh, gt, mask)
            loss = bce + 10 * thresh_loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 10 == 0 or not torch.isfinite(loss):
                print(f"step {step}  bce {bce.item():.4f}  l1 {thresh_loss.item():.4f}  total {loss.item():.4f}")
            step += 1


if __name__ == "__main__":
    train()
