"""Multitask toxicity classifier (Tox21-style) on fingerprint bit vectors.

Not every compound was tested in every assay, so the label matrix stores missing
measurements as NaN.  The loss keeps only measured entries: labels are filled with
torch.where before the BCE and the per-entry loss is weighted by the measured mask.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

N_TASKS, N_BITS = 12, 256


def load_assay_table(n_compounds=3000, seed=0):
    rng = np.random.default_rng(seed)
    fps = (rng.random((n_compounds, N_BITS)) < 0.08).astype(np.float32)
    w = rng.normal(0, 1, (N_BITS, N_TASKS)) * (rng.random((N_BITS, N_TASKS)) < 0.1)
    logits = fps @ w - 1.2
    labels = (rng.random((n_compounds, N_TASKS)) < 1 / (1 + np.exp(-3 * logits))).astype(np.float32)
    tested = rng.random((n_compounds, N_TASKS)) < rng.uniform(0.3, 0.9, N_TASKS)
    labels[~tested] = np.nan
    return fps, labels


class MultitaskMLP(nn.Module):
    def __init__(self, hidden=256):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(N_BITS, hidden), nn.ReLU(), nn.Dropout(0.2),
                                   nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.2))
        self.heads = nn.Linear(hidden, N_TASKS)

    def forward(self, x):
        return self.heads(self.trunk(x))


def masked_bce(logits, labels, pos_weight):
    measured = ~torch.isnan(labels)
    targets = torch.where(measured, labels, torch.zeros_like(labels))
    per_entry = F.binary_cross_entropy_with_logits(logits, targets, pos_weight=pos_weight, reduction="none")
    per_entry = per_entry * measured
    return per_entry.sum() / measured.sum().clamp(min=1)


def masked_auc(scores, labels):
    aucs = []
    for t in range(labels.shape[1]):
        keep = ~torch.isnan(labels[:, t])
        y, s = labels[keep, t], scores[keep, t]
        pos, neg = s[y == 1], s[y == 0]
        if len(pos) and len(neg):
            aucs.append((pos[:, None] > neg[None, :]).float().mean().item())
    return float(np.mean(aucs))


def main():
    torch.manual_seed(0)
    fps, labels = load_assay_table()
    x, y = torch.from_numpy(fps), torch.from_numpy(labels)
    print(f"compounds {len(x)}  tasks {N_TASKS}  measured entries {(~torch.isnan(y)).float().mean():.1%}")
    train = TensorDataset(x[:2500], y[:2500])
    val_x, val_y = x[2500:], y[2500:]

    measured = ~torch.isnan(y[:2500])
    pos = torch.nansum(y[:2500], dim=0)
    pos_weight = ((measured.sum(0) - pos) / pos.clamp(min=1)).clamp(max=10.0)

    model = MultitaskMLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    loader = DataLoader(train, batch_size=64, shuffle=True)
    for epoch in range(8):
        model.train()
        total = 0.0
        for xb, yb in loader:
            loss = masked_bce(model(xb), yb, pos_weight)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        model.eval()
        with torch.no_grad():
            val_logits = model(val_x)
            val_loss = masked_bce(val_logits, val_y, pos_weight).item()
        print(f"epoch {epoch} train_loss {total / len(loader):.4f} val_loss {val_loss:.4f} "
              f"val_mean_auc {masked_auc(val_logits, val_y):.3f}")


if __name__ == "__main__":
    main()
