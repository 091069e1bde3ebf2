"""Regression on tabular features with PyTorch Lightning: the features are standardized with
numpy before training, one of them is constant in this data."""

import lightning as L
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def load_features(n=512, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    x[:, 4] = 1.0  # a sensor that never changed in this export
    y = x[:, :3].sum(axis=1, keepdims=True) + 0.1 * rng.normal(size=(n, 1)).astype(np.float32)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    return torch.from_numpy(x), torch.from_numpy(y)


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        print(f"step {self.global_step} loss {loss.item():.4f}")
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    L.seed_everything(0)
    features, targets = load_features()
    loader = DataLoader(TensorDataset(features, targets), batch_size=64, shuffle=True)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), loader)
