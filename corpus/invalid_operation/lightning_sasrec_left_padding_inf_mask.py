"""SASRec-style next-item recommender on click sessions, trained with PyTorch Lightning.

Sessions of different lengths are left-padded (so the most recent click is always
the last position); a small causal self-attention encoder reads the session and the
representation at the last position scores the next item.
"""
import argparse
import math

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

PAD = 0


def make_sessions(n_sessions, n_items, max_len, seed):
    """Random walks on an item graph: each item is usually followed by one of its 3 successors."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(1, n_items, (n_items, 3), generator=g)
    sessions = []
    for _ in range(n_sessions):
        length = int(torch.randint(3, max_len + 2, (1,), generator=g))
        item = int(torch.randint(1, n_items, (1,), generator=g))
        seq = [item]
        for _ in range(length - 1):
            if torch.rand(1, generator=g) < 0.85:
                item = int(successors[item, torch.randint(0, 3, (1,), generator=g)])
            else:
                item = int(torch.randint(1, n_items, (1,), generator=g))
            seq.append(item)
        sessions.append(seq)
    return sessions


class SessionDataset(Dataset):
    def __init__(self, sessions):
        self.sessions = sessions

    def __len__(self):
        return len(self.sessions)

    def __getitem__(self, i):
        seq = self.sessions[i]
        return torch.tensor(seq[:-1]), seq[-1]


def left_pad_collate(batch):
    max_len = max(len(x) for x, _ in batch)
    items = torch.full((len(batch), max_len), PAD, dtype=torch.long)
    for row, (x, _) in enumerate(batch):
        items[row, max_len - len(x):] = x
    targets = torch.tensor([y for _, y in batch])
    return items, targets


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, dropout):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, pad_mask):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        future = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        blocked = future[None, None] | pad_mask[:, None, None, :]
        scores = scores.masked_fill(blocked, float("-inf"))
        attn = self.drop(scores.softmax(dim=-1))
        out = (attn @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(out)


class Block(nn.Module):
    def __init__(self, dim, heads, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, x, pad_mask):
        x = x + self.attn(self.ln1(x), pad_mask)
        return x + self.ffn(self.ln2(x))


class SASRec(L.LightningModule):
    def __init__(self, n_items, max_len, dim=64, heads=2, layers=2, dropout=0.1, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.item_emb = nn.Embedding(n_items, dim, padding_idx=PAD)
        self.pos_emb = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList([Block(dim, heads, dropout) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.05)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()

    def forward(self, items):
        pad_mask = items == PAD
        pos = torch.arange(items.shape[1], device=items.device)
        x = self.item_emb(items) + self.pos_emb(pos)[None]
        for block in self.blocks:
            x = block(x, pad_mask)
        last = self.ln(x[:, -1])
        return last @ self.item_emb.weight.T

    def training_step(self, batch, batch_idx):
        items, target = batch
        loss = F.cross_entropy(self(items), target)
        if self.global_step % 5 == 0:
            print(f"epoch {self.current_epoch} step {self.global_step:4d} loss {loss.item():.4f}")
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--max-len", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    L.seed_everything(0, verbose=False)
    sessions = make_sessions(args.sessions, args.items, args.max_len, seed=1)
    loader = DataLoader(SessionDataset(sessions), batch_size=args.batch_size,
                        shuffle=True, collate_fn=left_pad_collate)
    model = SASRec(args.items, args.max_len)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader)


if __name__ == "__main__":
    main()
