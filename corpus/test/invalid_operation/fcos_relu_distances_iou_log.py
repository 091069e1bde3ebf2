"""Single-level FCOS-style detector on synthetic 32x32 scenes with one object each.

Every feature-map location inside the ground-truth box regresses its distances
(l, t, r, b) to the box sides; the regression branch uses ReLU-normalised distances
(``norm_reg_targets``) and the UnitBox IoU loss -log(IoU); classification is a
plain BCE over all locations.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

STRIDE = 4
IMG = 32


class SceneDataset(Dataset):
    def __init__(self, n=384, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.samples = []
        for _ in range(n):
            w, h = (torch.randint(3, 17, (2,), generator=g)).tolist()
            x1 = int(torch.randint(0, IMG - w, (1,), generator=g))
            y1 = int(torch.randint(0, IMG - h, (1,), generator=g))
            img = 0.2 * torch.randn(1, IMG, IMG, generator=g)
            img[:, y1:y1 + h, x1:x1 + w] += 1.0
            self.samples.append((img, torch.tensor([x1, y1, x1 + w, y1 + h], dtype=torch.float32)))

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def location_grid():
    c = torch.arange(IMG // STRIDE, dtype=torch.float32) * STRIDE + STRIDE / 2
    yy, xx = torch.meshgrid(c, c, indexing="ij")
    return torch.stack([xx.flatten(), yy.flatten()], dim=1)  # (HW, 2)


LOCATIONS = location_grid()


def encode_targets(boxes):
    x, y = LOCATIONS[:, 0][None], LOCATIONS[:, 1][None]
    l = x - boxes[:, 0:1]
    t = y - boxes[:, 1:2]
    r = boxes[:, 2:3] - x
    b = boxes[:, 3:4] - y
    reg = torch.stack([l, t, r, b], dim=-1) / STRIDE          # (B, HW, 4)
    pos = reg.min(dim=-1).values > 0
    return reg, pos


class FCOSHead(nn.Module):
    def __init__(self, c=32):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c, c, 3, padding=1), nn.ReLU())
        self.cls = nn.Conv2d(c, 1, 3, padding=1)
        self.reg = nn.Conv2d(c, 4, 3, padding=1)
        for m in (self.cls, self.reg):
            nn.init.normal_(m.weight, std=0.01)
            nn.init.constant_(m.bias, 0.0)
        nn.init.constant_(self.cls.bias, -2.0)

    def forward(self, x):
        f = self.backbone(x)
        cls = self.cls(f).flatten(1)                          # (B, HW)
        reg = F.relu(self.reg(f)).flatten(2).transpose(1, 2)  # (B, HW, 4)
        return cls, reg


def iou_loss(pred, target):
    pl, pt, pr, pb = pred.unbind(-1)
    tl, tt, tr, tb = target.unbind(-1)
    pred_area = (pl + pr) * (pt + pb)
    target_area = (tl + tr) * (tt + tb)
    w_inter = torch.min(pl, tl) + torch.min(pr, tr)
    h_inter = torch.min(pt, tt) + torch.min(pb, tb)
    inter = w_inter * h_inter
    union = pred_area + target_area - inter
    ious = inter / union
    return -torch.log(ious).mean()


def main():
    torch.manual_seed(0)
    loader = DataLoader(SceneDataset(), batch_size=16, shuffle=True)
    model = FCOSHead()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    step = 0
    for epoch in range(8):
        for img, boxes in loader:
            cls, reg = model(img)
            reg_t, pos = encode_targets(boxes)
            loss_cls = F.binary_cross_entropy_with_logits(cls, pos.float())
            loss_reg = iou_loss(reg[pos], reg_t[pos])
            loss = loss_cls + loss_reg
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step:4d} loss {loss.item():.4f} "
                      f"cls {loss_cls.item():.4f} iou {loss_reg.item():.4f}")
            step += 1


if __name__ == "__main__":
    main()
