"""Self-supervised (blind-spot) denoiser for imaging mass cytometry channels, with Lightning.

Each training patch has a few random pixels replaced by a neighbour's value; a small
U-Net sees the corrupted patch and is trained to predict the original values at those
pixels only (Noise2Void-style), so no clean images are needed.
"""
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

TRAIN_CONFIG = {
    "n_images": 24,
    "image_size": 128,
    "patch_size": 32,
    "patches_per_image": 16,
    "mask_fraction": 0.02,
    "train_batch_size": 16,
    "train_epochs": 3,
    "train_initial_lr": 1.0,
    "lr_decay_rate": 0.5,
}


def simulate_channel(n_images, size, seed=0):
    """Sparse cells (Gaussian blobs) imaged as Poisson counts, plus a few hot pixels."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    images = []
    for _ in range(n_images):
        rate = torch.zeros(size, size)
        n_cells = int(torch.randint(30, 80, (1,), generator=g))
        for _ in range(n_cells):
            cy, cx = torch.rand(2, generator=g) * size
            amp = 2.0 + 8.0 * torch.rand(1, generator=g)
            rate += amp * torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * 2.5 ** 2))
        counts = torch.poisson(rate + 0.05, generator=g)
        hot = torch.rand(size, size, generator=g) < 0.001
        counts[hot] += 50.0
        images.append(counts)
    return torch.stack(images)[:, None]


class BlindSpotPatches(Dataset):
    def __init__(self, images, cfg, seed=0):
        g = torch.Generator().manual_seed(seed)
        p = cfg["patch_size"]
        patches = []
        for img in images:
            for _ in range(cfg["patches_per_image"]):
                y, x = torch.randint(0, img.shape[-1] - p, (2,), generator=g)
                patches.append(img[:, y:y + p, x:x + p])
        self.patches = torch.stack(patches)
        self.mask_fraction = cfg["mask_fraction"]

    def __len__(self):
        return len(self.patches)

    def __getitem__(self, i):
        target = self.patches[i]
        mask = torch.rand_like(target) < self.mask_fraction
        shifted = torch.roll(target, shifts=(1, 1), dims=(-2, -1))
        corrupted = torch.where(mask, shifted, target)
        return corrupted, target, mask.float()


class ConvBlock(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(
            nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(),
        )


class SmallUNet(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.enc1 = ConvBlock(1, c)
        self.enc2 = ConvBlock(c, 2 * c)
        self.bottleneck = ConvBlock(2 * c, 4 * c)
        self.up2 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.dec2 = ConvBlock(4 * c, 2 * c)
        self.up1 = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.dec1 = ConvBlock(2 * c, c)
        self.out = nn.Conv2d(c, 1, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        b = self.bottleneck(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(b), e2], 1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], 1))
        return self.out(d1)


class BlindSpotDenoiser(L.LightningModule):
    def __init__(self, cfg):
        super().__init__()
        self.save_hyperparameters(cfg)
        self.net = SmallUNet()

    def training_step(self, batch, batch_idx):
        corrupted, target, mask = batch
        pred = self.net(corrupted)
        loss = ((pred - target) ** 2 * mask).sum() / mask.sum().clamp(min=1.0)
        if batch_idx % 2 == 0:
            print(f"epoch {self.current_epoch} batch {batch_idx:2d} masked_mse {loss.item():.5f}")
        return loss

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams["train_initial_lr"])
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=self.hparams["lr_decay_rate"])
        return [opt], [sched]


def main():
    torch.manual_seed(0)
    L.seed_everything(0, verbose=False)
    cfg = TRAIN_CONFIG
    images = simulate_channel(cfg["n_images"], cfg["image_size"])
    loader = DataLoader(BlindSpotPatches(images, cfg), batch_size=cfg["train_batch_size"], shuffle=True)
    model = BlindSpotDenoiser(cfg)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=cfg["train_epochs"],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader)


if __name__ == "__main__":
    main()
