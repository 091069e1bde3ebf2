"""CTR model (sparse id embeddings + dense features, Deep & Cross network) trained
with Lightning and no gradient clipping; after a while the loss goes nan.

Reproduces https://github.com/alibaba/x-deeplearning/issues/232 ("训练出现nan值",
NaN appears during training): a click-through-rate model with sparse and dense
features trained fine for a long time and then produced nan.  Lowering the
learning rate and adding regularisation did not help; the reporter asked
whether gradient clipping is supported, added clipping, and the problem went
away ("做了clip问题消失").

Here the click log is synthetic (written to a CSV and read back).  The cross
layers x_{l+1} = x0 * (x_l . w_l) + b_l + x_l make the logit a high-degree
polynomial of the input, so once the cross weights have grown a little the
gradient of an unlucky batch is orders of magnitude larger than usual; the
unclipped momentum-SGD step then throws the weights out and the loss is nan.

Fix: clip the gradient norm, e.g. pl.Trainer(..., gradient_clip_val=1.0).
"""
import argparse
import csv
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import lightning.pytorch as pl

N_DENSE = 8
N_SPARSE = 6
VOCAB = 200


def write_click_log(path, n_rows=12000, seed=0):
    rng = np.random.RandomState(seed)
    w_dense = rng.normal(0, 0.6, size=N_DENSE)
    w_sparse = rng.normal(0, 1.0, size=(N_SPARSE, VOCAB))
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["label"] + [f"I{i}" for i in range(N_DENSE)] + [f"C{j}" for j in range(N_SPARSE)])
        for _ in range(n_rows):
            counts = rng.poisson(rng.gamma(1.0, 20.0, size=N_DENSE))
            ids = rng.zipf(1.3, size=N_SPARSE) % VOCAB
            z = (np.log1p(counts) - 2.5) @ w_dense * 0.5
            z += sum(w_sparse[j, ids[j]] for j in range(N_SPARSE)) * 0.5 - 1.0
            label = int(rng.rand() < 1.0 / (1.0 + np.exp(-z)))
            writer.writerow([label] + counts.tolist() + ids.tolist())


class ClickLogDataset(Dataset):
    def __init__(self, path):
        rows = list(csv.reader(open(path)))[1:]
        arr = np.asarray(rows, dtype=np.int64)
        self.labels = arr[:, 0].astype(np.float32)
        dense = np.log1p(arr[:, 1:1 + N_DENSE].astype(np.float32))
        self.dense = (dense - dense.mean(0)) / dense.std(0)
        self.sparse = arr[:, 1 + N_DENSE:]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return (torch.from_numpy(self.dense[i]), torch.from_numpy(self.sparse[i]),
                torch.tensor(self.labels[i]))


class CrossLayer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim) * 0.05)
        self.b = nn.Parameter(torch.zeros(dim))

    def forward(self, x0, xl):
        return x0 * (xl @ self.w).unsqueeze(1) + self.b + xl


class DeepCrossCTR(pl.LightningModule):
    def __init__(self, emb_dim=8, n_cross=6, hidden=64, lr=0.05, momentum=0.9):
        super().__init__()
        self.save_hyperparameters()
        self.embeddings = nn.ModuleList([nn.Embedding(VOCAB, emb_dim) for _ in range(N_SPARSE)])
        dim = N_DENSE + N_SPARSE * emb_dim
        self.cross = nn.ModuleList([CrossLayer(dim) for _ in range(n_cross)])
        self.deep = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(dim + hidden, 1)

    def forward(self, dense, sparse):
        embs = [emb(sparse[:, j]) for j, emb in enumerate(self.embeddings)]
        x0 = torch.cat([dense] + embs, dim=1)
        xl = x0
        for layer in self.cross:
            xl = layer(x0, xl)
        return self.head(torch.cat([xl, self.deep(x0)], dim=1)).squeeze(1)

    def training_step(self, batch, batch_idx):
        dense, sparse, y = batch
        logit = self(dense, sparse)
        loss = F.binary_cross_entropy_with_logits(logit, y)
        self.log("train_loss", loss, prog_bar=True)
        if self.global_step % 20 == 0:
            print(f"epoch {self.current_epoch} step {self.global_step} logloss {loss.item():.5f}")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--n_cross", type=int, default=6)
    args = parser.parse_args()

    pl.seed_everything(42)
    path = os.path.join(tempfile.gettempdir(), "click_log_xdl232.csv")
    write_click_log(path)
    ds = ClickLogDataset(path)
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True)

    model = DeepCrossCTR(n_cross=args.n_cross, lr=args.lr)
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()
