"""RetinaNet-style loss normalised by the number of positive anchors, which can be zero.

Reproduces the bug fixed in https://github.com/keras-team/keras-hub/pull/2791 ("Prevent division
by zero in anchor normalizer calculation"): the classification and box losses are summed over
anchors and divided by the number of positive anchors in the batch.  When the random-crop
augmentation cuts every object out of every image of a batch, that count is 0: the focal loss
becomes x / 0 = inf, the (empty) box loss 0 / 0 = nan, and the NaN gradients poison the weights.
With crops that usually keep the object this only happens after a few hundred iterations.

Fix (as in the PR): clamp the normaliser to at least 1, e.g.
    cls_loss / positive.sum().clamp(min=1), box_loss / positive.sum().clamp(min=1)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

IMG, CROP, GRID = 19, 16, 4          # full image, random crop, anchors per side (stride 4)
STRIDE = CROP // GRID


class ShapesDataset(Dataset):
    """One bright square per image; the training crop may or may not contain it."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.images = 0.1 * torch.randn(n, 1, IMG, IMG, generator=g)
        self.boxes = torch.zeros(n, 4)
        for i in range(n):
            s = int(torch.randint(3, 7, (1,), generator=g))
            x0, y0 = (int(v) for v in torch.randint(0, IMG - s, (2,), generator=g))
            self.images[i, 0, y0:y0 + s, x0:x0 + s] += 1.0
            self.boxes[i] = torch.tensor([x0, y0, x0 + s, y0 + s], dtype=torch.float)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        ox, oy = (int(v) for v in torch.randint(0, IMG - CROP + 1, (2,)))
        img = self.images[i, :, oy:oy + CROP, ox:ox + CROP]
        box = self.boxes[i] - torch.tensor([ox, oy, ox, oy], dtype=torch.float)
        cls_t = torch.zeros(GRID, GRID)
        box_t = torch.zeros(GRID, GRID, 4)
        cx, cy = (box[0] + box[2]) / 2, (box[1] + box[3]) / 2
        if 0 <= cx < CROP and 0 <= cy < CROP:          # object centre survived the crop
            gx, gy = int(cx // STRIDE), int(cy // STRIDE)
            cls_t[gy, gx] = 1.0
            acx, acy = (gx + 0.5) * STRIDE, (gy + 0.5) * STRIDE
            box_t[gy, gx] = torch.stack([(cx - acx) / STRIDE, (cy - acy) / STRIDE,
                                         torch.log((box[2] - box[0]) / STRIDE), torch.log((box[3] - box[1]) / STRIDE)])
        return img, cls_t, box_t


class TinyRetina(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.cls_head = nn.Conv2d(32, 1, 3, padding=1)
        self.box_head = nn.Conv2d(32, 4, 3, padding=1)
        nn.init.constant_(self.cls_head.bias, -4.6)     # prior p = 0.01

    def forward(self, x):
        f = self.backbone(x)
        return self.cls_head(f).squeeze(1), self.box_head(f).permute(0, 2, 3, 1)


def focal_loss(logits, targets, alpha=0.25, gamma=2.0):
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    a_t = alpha * targets + (1 - alpha) * (1 - targets)
    return (a_t * (1 - p_t) ** gamma * ce).sum()


def detection_loss(cls_out, box_out, cls_t, box_t):
    positive = cls_t > 0
    cls_loss = focal_loss(cls_out, cls_t)
    box_loss = F.smooth_l1_loss(box_out[positive], box_t[positive], reduction="sum")
    return cls_loss / positive.sum(), box_loss / positive.sum()


def main():
    torch.manual_seed(2791)
    loader = DataLoader(ShapesDataset(512, seed=0), batch_size=2, shuffle=True)
    model = TinyRetina()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    step = 0
    for epoch in range(2):
        for img, cls_t, box_t in loader:
            cls_out, box_out = model(img)
            cls_loss, box_loss = detection_loss(cls_out, box_out, cls_t, box_t)
            loss = cls_loss + box_loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 10 == 0:
                print(f"epoch {epoch} iter {step:4d}  cls {cls_loss.item():.4f}  box {box_loss.item():.4f}  total {loss.item():.4f}")
            step += 1


if __name__ == "__main__":
    main()
