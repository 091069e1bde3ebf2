"""Single-object localisation on synthetic 48x48 images with PyTorch Lightning:
a plain (no normalisation) conv backbone, a class head and a box head that
regresses (cx, cy, w, h) in pixels, trained with SGD + momentum at the
mmdetection-style base lr 0.02, and no gradient clipping in the Trainer.

The box loss is summed over the four coordinates and objects of very different
(log-normal) sizes, so some batches produce gradient norms in the thousands.
The first iterations look normal (loss ~130-270, one spike at iter 6), then an
unclipped step at iter 14 throws the un-normalised conv stack into a region
where activations and gradients grow without bound: loss 7e6 at iter 15, 5e35
at iter 17 and NaN from iter 18 on.

Report: https://github.com/open-mmlab/mmdetection/issues/8659 - training loss
goes NaN without `grad_clip`; the maintainers' answer: "grad_clip can avoid NaN
in loss very well" (grad_clip=dict(max_norm=35, norm_type=2), as in their FAQ).
Fix: clip the gradient norm (Trainer(gradient_clip_val=35,
gradient_clip_algorithm="norm")).
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import lightning as L
from torch.utils.data import DataLoader, Dataset

L.seed_everything(0, verbose=False)


class ShapesDataset(Dataset):
    def __init__(self, n=2048, size=48, seed=0):
        rng = np.random.RandomState(seed)
        self.images = np.zeros((n, 1, size, size), dtype=np.float32)
        self.boxes = np.zeros((n, 4), dtype=np.float32)
        self.labels = rng.randint(0, 3, size=n)
        for i in range(n):
            w, h = rng.lognormal(2.2, 0.45, size=2).clip(3, size - 2)
            cx = rng.uniform(w / 2, size - w / 2)
            cy = rng.uniform(h / 2, size - h / 2)
            x0, x1 = int(cx - w / 2), int(cx + w / 2)
            y0, y1 = int(cy - h / 2), int(cy + h / 2)
            self.images[i, 0, y0:y1, x0:x1] = 0.5 + 0.25 * self.labels[i]
            self.boxes[i] = (cx, cy, w, h)
        self.images += 0.05 * rng.randn(*self.images.shape).astype(np.float32)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.labels[i], self.boxes[i]


class Localizer(L.LightningModule):
    def __init__(self, lr=0.02):
        super().__init__()
        self.save_hyperparameters()
        chans = [1, 32, 64, 64, 128, 128]
        layers = []
        for cin, cout in zip(chans[:-1], chans[1:]):
            layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2) if cout != 128 or cin == 64 else nn.Identity()]
        self.backbone = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.cls_head = nn.Linear(128, 3)
        self.box_head = nn.Linear(128, 4)

    def forward(self, x):
        f = self.backbone(x)
        return self.cls_head(f), self.box_head(f)

    def training_step(self, batch, batch_idx):
        img, label, box = batch
        logits, pred_box = self(img)
        loss_cls = F.cross_entropy(logits, label)
        loss_box = F.mse_loss(pred_box, box, reduction="sum") / img.shape[0]
        loss = loss_cls + 0.1 * loss_box
        if self.global_step % 25 == 0 or self.global_step < 12:
            print(f"iter {self.global_step:4d}  loss {loss.item():.4f}  loss_cls {loss_cls.item():.4f}  loss_bbox {loss_box.item():.4f}")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=1e-4)


def main():
    loader = DataLoader(ShapesDataset(n=1024), batch_size=16, shuffle=True)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Localizer(), loader)


if __name__ == "__main__":
    main()
