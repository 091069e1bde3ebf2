"""Binary segmentation of bright blobs with a small encoder-decoder and a focal loss.

The loss follows kornia 0.5's ``binary_focal_loss_with_logits``; gamma is lowered to
0.5 because the foreground is not that rare in this data set.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class BlobDataset(Dataset):
    def __init__(self, n=256, size=24, seed=0):
        g = torch.Generator().manual_seed(seed)
        yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        self.images, self.masks = [], []
        for _ in range(n):
            mask = torch.zeros(size, size)
            for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
                cy, cx = torch.randint(4, size - 4, (2,), generator=g)
                r = float(torch.randint(3, 7, (1,), generator=g))
                mask[((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r] = 1.0
            img = 0.8 * mask + 0.15 * torch.randn(size, size, generator=g)
            self.images.append(img.unsqueeze(0))
            self.masks.append(mask.unsqueeze(0))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.masks[i]


class TinyUNet(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.enc1 = nn.Sequential(nn.Conv2d(1, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1), nn.ReLU())
        self.enc2 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU())
        self.dec = nn.Sequential(nn.Conv2d(3 * c, c, 3, padding=1), nn.ReLU(), nn.Conv2d(c, 1, 1))

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        up = F.interpolate(e2, scale_factor=2, mode="nearest")
        return self.dec(torch.cat([e1, up], dim=1))


def binary_focal_loss_with_logits(input, target, alpha=0.25, gamma=2.0, reduction="mean", eps=1e-8):
    probs = torch.sigmoid(input)
    loss_tmp = -alpha * torch.pow((1.0 - probs), gamma) * target * torch.log(probs + eps) \
        - (1 - alpha) * torch.pow(probs, gamma) * (1.0 - target) * torch.log(1.0 - probs + eps)
    if reduction == "none":
        return loss_tmp
    if reduction == "mean":
        return loss_tmp.mean()
    return loss_tmp.sum()


def dice(logits, mask):
    pred = (logits > 0).float()
    inter = (pred * mask).sum()
    return (2 * inter / (pred.sum() + mask.sum() + 1e-6)).item()


def train(epochs=16, lr=3e-3, gamma=0.5):
    torch.manual_seed(0)
    loader = DataLoader(BlobDataset(), batch_size=16, shuffle=True)
    model = TinyUNet()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    step = 0
    for epoch in range(epochs):
        for img, mask in loader:
            logits = model(img)
            loss = binary_focal_loss_with_logits(logits, mask, alpha=0.25, gamma=gamma)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 10 == 0:
                print(f"epoch {epoch:2d} step {step:4d} focal {loss.item():.5f} dice {dice(logits, mask):.3f} "
                      f"max_logit {logits.max().item():.2f}")
            step += 1


if __name__ == "__main__":
    train()
