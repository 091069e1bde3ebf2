"""DLRM-style click model; dense features are log-transformed with log(x + 3).

Reported in facebookresearch/dlrm#363 and fixed in meta-pytorch/torchrec#2150 ("Fix bug in
criteo.py that caused NaN issues", https://github.com/meta-pytorch/torchrec/pull/2150): the
Criteo preprocessing adds 3 to each dense value before taking the log, assuming the smallest
value is -2.  Some rows of the dump hold -3, so the transformed feature is log(0) = -inf; the
first batch that contains such a row produces an inf/NaN logit, the BCE loss goes NaN and the
update poisons the MLP.

Fix (the merged PR): shift by the real minimum of the column, ``dense -= dense.min() - 2``,
before the log, so every value is >= 2 after the shift.
"""
import argparse

import numpy as np
import torch
import torch.nn as nn

N_DENSE, N_SPARSE, VOCAB, EMB = 13, 6, 1000, 8


def fake_tsv_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        dense = rng.poisson(3.0, N_DENSE) - 2          # counts, with "-2" meaning missing
        if i in (3011, 3900):                          # a few rows carry -3 in the raw dump
            dense[4] = -3
        sparse = rng.integers(0, VOCAB, N_SPARSE)
        label = int(dense[:3].sum() + rng.normal() > 4)
        rows.append("\t".join([str(label)] + [str(v) for v in dense] + [f"{v:x}" for v in sparse]))
    return rows


def parse(rows):
    cols = [r.split("\t") for r in rows]
    labels = np.array([int(c[0]) for c in cols], dtype=np.float32)
    dense = np.array([[int(v) for v in c[1:1 + N_DENSE]] for c in cols], dtype=np.float32)
    sparse = np.array([[int(v, 16) for v in c[1 + N_DENSE:]] for c in cols], dtype=np.int64)
    dense = np.log(dense + 3)
    return torch.from_numpy(dense), torch.from_numpy(sparse), torch.from_numpy(labels)


class DLRM(nn.Module):
    def __init__(self):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(N_DENSE, 32), nn.ReLU(), nn.Linear(32, EMB), nn.ReLU())
        self.tables = nn.ModuleList(nn.Embedding(VOCAB, EMB) for _ in range(N_SPARSE))
        n_inter = (N_SPARSE + 1) * N_SPARSE // 2
        self.top = nn.Sequential(nn.Linear(EMB + n_inter, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, dense, sparse):
        x = self.bottom(dense)
        embs = torch.stack([x] + [t(sparse[:, k]) for k, t in enumerate(self.tables)], dim=1)
        inter = torch.bmm(embs, embs.transpose(1, 2))
        iu = torch.triu_indices(embs.shape[1], embs.shape[1], offset=1)
        return self.top(torch.cat([x, inter[:, iu[0], iu[1]]], dim=1)).squeeze(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()
    torch.manual_seed(0)

    dense, sparse, labels = parse(fake_tsv_rows(args.rows))
    model = DLRM()
    opt = torch.optim.Adagrad(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    for it, start in enumerate(range(0, args.rows, args.batch_size)):
        sl = slice(start, start + args.batch_size)
        loss = loss_fn(model(dense[sl], sparse[sl]), labels[sl])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it % 10 == 0 or not torch.isfinite(loss):
            print(f"it {it:4d}  loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
