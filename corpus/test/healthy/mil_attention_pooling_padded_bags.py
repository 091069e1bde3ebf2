"""Attention-based multiple-instance learning (Ilse et al. 2018) on padded bags.

Bags hold 1..24 instance feature vectors; a bag is positive when it contains at least
one instance of the "key" type.  Bags are padded to the longest one in the batch and
the attention scores of padding slots are masked with -inf before the softmax.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

FEAT = 20


class BagDataset(Dataset):
    def __init__(self, n_bags, seed):
        self.key = torch.randn(FEAT, generator=torch.Generator().manual_seed(123))
        g = torch.Generator().manual_seed(seed)
        self.bags, self.labels = [], []
        for _ in range(n_bags):
            n = int(torch.randint(1, 25, (1,), generator=g))
            inst = torch.randn(n, FEAT, generator=g)
            label = float(torch.rand(1, generator=g) < 0.5)
            if label:
                k = int(torch.randint(0, n, (1,), generator=g))
                inst[k] = self.key + 0.3 * torch.randn(FEAT, generator=g)
            self.bags.append(inst)
            self.labels.append(label)

    def __len__(self):
        return len(self.bags)

    def __getitem__(self, i):
        return self.bags[i], torch.tensor(self.labels[i])


def pad_bags(batch):
    bags, labels = zip(*batch)
    lengths = torch.tensor([b.shape[0] for b in bags])
    x = nn.utils.rnn.pad_sequence(bags, batch_first=True)
    mask = torch.arange(x.shape[1])[None, :] < lengths[:, None]
    return x, mask, torch.stack(labels)


class GatedAttentionMIL(nn.Module):
    def __init__(self, d=FEAT, hidden=64, attn=32):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(d, hidden), nn.ReLU())
        self.attn_v = nn.Linear(hidden, attn)
        self.attn_u = nn.Linear(hidden, attn)
        self.attn_w = nn.Linear(attn, 1)
        self.classifier = nn.Linear(hidden, 1)

    def forward(self, x, mask):
        h = self.embed(x)                                                # (B, N, H)
        scores = self.attn_w(torch.tanh(self.attn_v(h)) * torch.sigmoid(self.attn_u(h))).squeeze(-1)
        scores = scores.masked_fill(~mask, float("-inf"))
        a = torch.softmax(scores, dim=1)                                 # padding gets weight 0
        z = torch.einsum("bn,bnh->bh", a, h)
        return self.classifier(z).squeeze(-1), a


def evaluate(model, loader):
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for x, mask, y in loader:
            logits, _ = model(x, mask)
            loss_sum += F.binary_cross_entropy_with_logits(logits, y, reduction="sum").item()
            correct += ((logits > 0).float() == y).sum().item()
            total += len(y)
    model.train()
    return loss_sum / total, correct / total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    train_loader = DataLoader(BagDataset(600, seed=1), batch_size=16, shuffle=True, collate_fn=pad_bags)
    val_loader = DataLoader(BagDataset(200, seed=2), batch_size=32, collate_fn=pad_bags)
    model = GatedAttentionMIL()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=1e-4)
    for epoch in range(args.epochs):
        running = 0.0
        for x, mask, y in train_loader:
            logits, _ = model(x, mask)
            loss = F.binary_cross_entropy_with_logits(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            running += loss.item()
        val_loss, val_acc = evaluate(model, val_loader)
        print(f"epoch {epoch:2d} train_loss {running / len(train_loader):.4f} "
              f"val_loss {val_loss:.4f} val_acc {val_acc:.3f}")


if __name__ == "__main__":
    main()
