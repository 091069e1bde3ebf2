"""Customer-churn classifier trained with PyTorch Lightning in bf16-mixed precision.

Synthetic tabular data (standardised numeric columns + one categorical column
embedded), a small residual MLP, AdamW with a cosine schedule stepped per batch.
"""
import argparse

import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class ChurnDataset(Dataset):
    def __init__(self, numeric, plan, label):
        self.numeric = torch.as_tensor(numeric, dtype=torch.float32)
        self.plan = torch.as_tensor(plan, dtype=torch.long)
        self.label = torch.as_tensor(label, dtype=torch.long)

    def __len__(self):
        return len(self.label)

    def __getitem__(self, idx):
        return self.numeric[idx], self.plan[idx], self.label[idx]


class ChurnDataModule(L.LightningDataModule):
    def __init__(self, n_rows=4000, n_numeric=12, n_plans=7, batch_size=128, seed=7):
        super().__init__()
        self.n_rows = n_rows
        self.n_numeric = n_numeric
        self.n_plans = n_plans
        self.batch_size = batch_size
        self.seed = seed

    def setup(self, stage=None):
        rng = np.random.default_rng(self.seed)
        numeric = rng.normal(size=(self.n_rows, self.n_numeric))
        numeric[:, 0] = rng.gamma(2.0, 30.0, size=self.n_rows)      # tenure in months
        numeric[:, 1] = rng.lognormal(3.5, 0.6, size=self.n_rows)   # monthly charges
        plan = rng.integers(0, self.n_plans, size=self.n_rows)
        logit = (-0.04 * numeric[:, 0] + 0.03 * numeric[:, 1] + 0.8 * numeric[:, 2]
                 - 0.6 * numeric[:, 3] + 0.5 * (plan % 3 == 0))
        label = (logit + rng.logistic(size=self.n_rows) > np.median(logit)).astype(np.int64)

        split = int(0.8 * self.n_rows)
        mean = numeric[:split].mean(axis=0)
        std = numeric[:split].std(axis=0) + 1e-6
        numeric = (numeric - mean) / std
        self.train_set = ChurnDataset(numeric[:split], plan[:split], label[:split])
        self.val_set = ChurnDataset(numeric[split:], plan[split:], label[split:])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=512)


class ResidualBlock(nn.Module):
    def __init__(self, width, dropout):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, width * 2)
        self.fc2 = nn.Linear(width * 2, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        h = self.fc2(self.drop(F.gelu(self.fc1(self.norm(x)))))
        return x + h


class ChurnModel(L.LightningModule):
    def __init__(self, n_numeric=12, n_plans=7, width=64, depth=3, lr=3e-3, weight_decay=1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.plan_emb = nn.Embedding(n_plans, 8)
        self.inp = nn.Linear(n_numeric + 8, width)
        self.blocks = nn.Sequential(*[ResidualBlock(width, 0.1) for _ in range(depth)])
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2))

    def forward(self, numeric, plan):
        x = torch.cat([numeric, self.plan_emb(plan)], dim=-1)
        return self.head(self.blocks(self.inp(x)))

    def training_step(self, batch, batch_idx):
        numeric, plan, label = batch
        logits = self(numeric, plan)
        loss = F.cross_entropy(logits.float(), label)
        if self.global_step % 20 == 0:
            print(f"epoch {self.current_epoch} step {self.global_step:4d} "
                  f"loss {loss.item():.4f} (compute dtype {logits.dtype})")
        return loss

    def validation_step(self, batch, batch_idx):
        numeric, plan, label = batch
        logits = self(numeric, plan)
        acc = (logits.argmax(-1) == label).float().mean()
        self.val_accs.append(acc.item())

    def on_validation_epoch_start(self):
        self.val_accs = []

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:
            return
        print(f"epoch {self.current_epoch} val_acc {np.mean(self.val_accs):.3f}")

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr,
                                weight_decay=self.hparams.weight_decay)
        total = self.trainer.estimated_stepping_batches
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--precision", default="bf16-mixed")
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    torch.manual_seed(0)
    dm = ChurnDataModule(batch_size=args.batch_size)
    model = ChurnModel()
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=args.epochs,
        precision=args.precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm)
    print("done")


if __name__ == "__main__":
    main()
