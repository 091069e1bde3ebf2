"""Wasserstein Discriminant Analysis (WDA) in Lightning: learn an orthonormal 2-D projection
that keeps classes compact (small within-class Wasserstein distance) and far apart (large
between-class Wasserstein distance), with entropic OT solved by a fixed number of Sinkhorn
iterations on each minibatch."""
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

import lightning as L

CONFIG = {
    "n_features": 10,
    "n_classes": 3,
    "proj_dim": 2,
    "reg": 0.1,
    "sinkhorn_iters": 10,
    "lr": 0.02,
    "batch_size": 96,
    "epochs": 25,
}


class GaussianClasses(Dataset):
    def __init__(self, n_per_class, n_features, n_classes, seed):
        rng = np.random.default_rng(seed)
        xs, ys = [], []
        for c in range(n_classes):
            mean = np.zeros(n_features)
            angle = 2 * np.pi * c / n_classes
            mean[0], mean[1] = 6.0 * np.cos(angle), 6.0 * np.sin(angle)
            x = rng.normal(size=(n_per_class, n_features)) * 2.0
            x[:, :2] = rng.normal(size=(n_per_class, 2)) * 0.8
            xs.append(x + mean)
            ys.append(np.full(n_per_class, c))
        x = np.concatenate(xs)
        x = (x - x.mean(0)) / x.std(0)
        self.x = torch.tensor(x, dtype=torch.float32)
        self.y = torch.tensor(np.concatenate(ys), dtype=torch.long)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def sq_dist(a, b):
    return (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T


def sinkhorn(wa, wb, M, reg, n_iters):
    K = torch.exp(-M / reg)
    u = torch.ones_like(wa)
    v = torch.ones_like(wb)
    for _ in range(n_iters):
        v = wb / (K.T @ u)
        u = wa / (K @ v)
    return u[:, None] * K * v[None, :]


class WDA(L.LightningModule):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.raw_proj = nn.Parameter(torch.randn(cfg["n_features"], cfg["proj_dim"]))

    def projection(self):
        q, _ = torch.linalg.qr(self.raw_proj)
        return q

    def wda_loss(self, x, y):
        P = self.projection()
        groups = [x[y == c] @ P for c in range(self.cfg["n_classes"])]
        groups = [g for g in groups if len(g) > 1]
        loss_w, loss_b = 0.0, 0.0
        for i, xi in enumerate(groups):
            wi = torch.full((len(xi),), 1.0 / len(xi))
            for j in range(i, len(groups)):
                xj = groups[j]
                wj = torch.full((len(xj),), 1.0 / len(xj))
                M = sq_dist(xi, xj)
                G = sinkhorn(wi, wj, M, self.cfg["reg"], self.cfg["sinkhorn_iters"])
                if i == j:
                    loss_w = loss_w + (G * M).sum()
                else:
                    loss_b = loss_b + (G * M).sum()
        return loss_w / loss_b, loss_w, loss_b

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss, lw, lb = self.wda_loss(x, y)
        step = self.global_step
        if step % 5 == 0:
            print(f"step {step:4d} wda_loss {loss.item():.5f} within {lw.item():.4f} between {lb.item():.4f}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        P = self.projection()
        z = x @ P
        centroids = torch.stack([z[y == c].mean(0) for c in range(self.cfg["n_classes"])])
        pred = torch.cdist(z, centroids).argmin(1)
        self.val_acc = (pred == y).float().mean().item()

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            print(f"epoch {self.current_epoch} val nearest-centroid acc {self.val_acc:.3f}")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.cfg["lr"])


def main():
    cfg = CONFIG
    L.seed_everything(0, verbose=False)
    train = GaussianClasses(160, cfg["n_features"], cfg["n_classes"], seed=1)
    val = GaussianClasses(100, cfg["n_features"], cfg["n_classes"], seed=2)
    train_loader = DataLoader(train, batch_size=cfg["batch_size"], shuffle=True, drop_last=True)
    val_loader = DataLoader(val, batch_size=len(val))

    model = WDA(cfg)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=cfg["epochs"],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, train_loader, val_loader)


if __name__ == "__main__":
    main()
