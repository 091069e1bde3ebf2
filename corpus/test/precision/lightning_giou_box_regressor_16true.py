"""Single-object localiser (Lightning, precision="16-true") trained with a GIoU loss.

A small CNN looks at 64x64 thumbnails of 320x320 document scans and regresses the box of
the one stamp on the page, in page pixels (x1, y1, x2, y2).  The loss is an L1 term on
normalised coordinates plus a generalized-IoU loss written like torchvision's
``generalized_box_iou_loss`` (the version before the fix).

With ``precision="16-true"`` Lightning casts the module *and* the float tensors of each batch
to float16, so the box areas are computed in half precision.  Areas of up to 200x200 px are
representable (40000 < 65504), but ``union = area1 + area2 - inter`` first forms
``area1 + area2``: once the predictions for the large stamps grow to roughly the right size
that sum exceeds 65504 and becomes inf, union = inf, GIoU = iou - (area_c - inf) / area_c = inf
and the loss goes to -inf / nan, its backward NaN; every weight is NaN after that step.

Reproduces the overflow fixed in pytorch/vision PR #5685 ("call _upcast to consider overflow
for computing giou loss": "giou loss is weak at overflow problem because it computes area of
box"):  https://github.com/pytorch/vision/pull/5685

Fix: upcast the boxes to float32 before computing areas / intersection / union, i.e.
``boxes1 = boxes1.float(); boxes2 = boxes2.float()`` at the top of the loss (torchvision's
``_upcast_non_float``).
"""
import argparse
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import lightning as L

PAGE = 320.0   # page size in pixels
THUMB = 64     # network input size


def generalized_box_iou_loss(boxes1, boxes2, reduction="mean", eps=1e-7):
    """GIoU loss between predicted boxes1 and target boxes2, both (N, 4) in xyxy."""
    x1, y1, x2, y2 = boxes1.unbind(dim=-1)
    x1g, y1g, x2g, y2g = boxes2.unbind(dim=-1)

    # intersection
    xkis1 = torch.max(x1, x1g)
    ykis1 = torch.max(y1, y1g)
    xkis2 = torch.min(x2, x2g)
    ykis2 = torch.min(y2, y2g)
    intsctk = torch.zeros_like(x1)
    mask = (ykis2 > ykis1) & (xkis2 > xkis1)
    intsctk[mask] = (xkis2[mask] - xkis1[mask]) * (ykis2[mask] - ykis1[mask])

    # union
    unionk = (x2 - x1) * (y2 - y1) + (x2g - x1g) * (y2g - y1g) - intsctk
    iouk = intsctk / (unionk + eps)

    # smallest enclosing box
    xc1 = torch.min(x1, x1g)
    yc1 = torch.min(y1, y1g)
    xc2 = torch.max(x2, x2g)
    yc2 = torch.max(y2, y2g)
    area_c = (xc2 - xc1) * (yc2 - yc1)
    miouk = iouk - ((area_c - unionk) / (area_c + eps))

    loss = 1 - miouk
    if reduction == "mean":
        loss = loss.mean() if loss.numel() > 0 else 0.0 * loss.sum()
    elif reduction == "sum":
        loss = loss.sum()
    return loss


class StampPages(Dataset):
    """Synthetic scans: noisy paper texture with one darker rectangular stamp."""

    def __init__(self, n, seed):
        rng = np.random.RandomState(seed)
        self.images = np.zeros((n, 1, THUMB, THUMB), dtype=np.float32)
        self.boxes = np.zeros((n, 4), dtype=np.float32)
        scale = THUMB / PAGE
        for i in range(n):
            w, h = rng.uniform(30, 200, size=2)
            x1 = rng.uniform(0, PAGE - w)
            y1 = rng.uniform(0, PAGE - h)
            img = 0.1 * rng.randn(THUMB, THUMB)
            c1, r1 = int(x1 * scale), int(y1 * scale)
            c2, r2 = int(math.ceil((x1 + w) * scale)), int(math.ceil((y1 + h) * scale))
            img[r1:r2, c1:c2] += 1.0
            self.images[i, 0] = img
            self.boxes[i] = [x1, y1, x1 + w, y1 + h]

    def __len__(self):
        return len(self.images)

    def __getitem__(self, idx):
        return torch.from_numpy(self.images[idx]), torch.from_numpy(self.boxes[idx])


class StampLocalizer(L.LightningModule):
    def __init__(self, lr=0.02, giou_weight=2.0, l1_weight=5.0, log_every=10):
        super().__init__()
        self.save_hyperparameters()
        self.backbone = nn.Sequential(
            nn.Conv2d(1, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
        )
        self.head = nn.Sequential(nn.Linear(32 * 16, 128), nn.ReLU(), nn.Linear(128, 4))
        nn.init.zeros_(self.head[-1].weight)
        nn.init.zeros_(self.head[-1].bias)

    def forward(self, images):
        raw = self.head(self.backbone(images))
        cx = torch.sigmoid(raw[:, 0]) * PAGE
        cy = torch.sigmoid(raw[:, 1]) * PAGE
        w = 64.0 * torch.exp(raw[:, 2])
        h = 64.0 * torch.exp(raw[:, 3])
        return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)

    def _losses(self, batch):
        images, boxes = batch
        pred = self(images)
        l1 = F.l1_loss(pred / PAGE, boxes / PAGE)
        giou = generalized_box_iou_loss(pred, boxes)
        return pred, l1, giou

    def training_step(self, batch, batch_idx):
        _, l1, giou = self._losses(batch)
        loss = self.hparams.l1_weight * l1 + self.hparams.giou_weight * giou
        self.log("train_loss", loss)
        if self.global_step % self.hparams.log_every == 0:
            print(f"step {self.global_step:4d}  loss {loss.item():.4f}  l1 {l1.item():.4f}  giou {giou.item():.4f}")
        return loss

    def validation_step(self, batch, batch_idx):
        pred, l1, giou = self._losses(batch)
        self.log("val_giou", giou, prog_bar=False)
        self.log("val_l1", l1, prog_bar=False)

    def on_validation_epoch_end(self):
        m = self.trainer.callback_metrics
        if "val_giou" in m and not self.trainer.sanity_checking:
            print(f"epoch {self.current_epoch}  val_giou {m['val_giou'].item():.4f}  val_l1 {m['val_l1'].item():.4f}")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--precision", default="16-true")
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    train_ds = StampPages(1024, seed=1)
    val_ds = StampPages(256, seed=2)
    train_dl = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True)
    val_dl = DataLoader(val_ds, batch_size=128)

    model = StampLocalizer(lr=args.lr, log_every=args.log_every)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision=args.precision,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dl, val_dl)


if __name__ == "__main__":
    main()
