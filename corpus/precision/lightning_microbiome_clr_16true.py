"""Disease-status classifier on gut microbiome relative abundances (PyTorch Lightning).

Each sample is a vector of taxon proportions (counts + pseudocount, divided by library
size). The model applies a centred log-ratio (CLR) transform and an MLP. Training runs
in pure 16-bit to fit larger cohorts in memory.
"""
import argparse

import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def simulate_cohort(n_samples=2000, n_taxa=256, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.dirichlet(np.full(n_taxa, 0.08))
    label = rng.integers(0, 2, size=n_samples)
    shift = np.zeros(n_taxa)
    shift[:12] = 1.5
    depth = rng.lognormal(np.log(8e5), 0.4, size=n_samples)
    deep = rng.random(n_samples) < 0.004                     # a few deeply sequenced runs
    depth[deep] = rng.uniform(4e7, 9e7, size=deep.sum())
    props = np.empty((n_samples, n_taxa))
    for i in range(n_samples):
        p = base * np.exp(shift * label[i] + 0.3 * rng.normal(size=n_taxa))
        p /= p.sum()
        counts = rng.poisson(p * depth[i])
        props[i] = (counts + 0.5) / (counts.sum() + 0.5 * n_taxa)
    return props.astype(np.float32), label


class AbundanceDataset(Dataset):
    def __init__(self, props, label):
        self.props = torch.from_numpy(props)
        self.label = torch.from_numpy(label).long()

    def __len__(self):
        return len(self.label)

    def __getitem__(self, i):
        return self.props[i], self.label[i]


class CohortDataModule(L.LightningDataModule):
    def __init__(self, batch_size=32):
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage=None):
        props, label = simulate_cohort()
        self.train_set = AbundanceDataset(props, label)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)


class CLR(nn.Module):
    def forward(self, x):
        logx = torch.log(x)
        return logx - logx.mean(dim=-1, keepdim=True)


class MicrobiomeClassifier(L.LightningModule):
    def __init__(self, n_taxa=256, hidden=128, lr=0.01):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            CLR(),
            nn.BatchNorm1d(n_taxa),
            nn.Linear(n_taxa, hidden), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 2),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(-1) == y).float().mean()
        print(f"epoch {self.current_epoch} step {self.global_step:3d} "
              f"loss {loss.item():.4f} acc {acc.item():.3f}")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--precision", default="16-true")
    args = parser.parse_args()

    torch.manual_seed(0)
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        accelerator="cpu",
        precision=args.precision,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(MicrobiomeClassifier(), datamodule=CohortDataModule())


if __name__ == "__main__":
    main()
