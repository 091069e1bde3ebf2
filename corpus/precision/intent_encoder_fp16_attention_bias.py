"""Intent classifier: a small Transformer encoder over padded utterances, mixed precision.

The attention module follows the Flax/linen recipe: a boolean padding mask built with
make_attention_mask(query_valid, key_valid) is turned into an additive attention bias in the
compute dtype, and the encoder runs under autocast (float16 by default, as on the GPU boxes).
Utterances of a batch are padded to the longest one; the [CLS] position is classified.
"""
import argparse
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

PAD, CLS = 0, 1
N_INTENTS = 6
VOCAB = 240
MAX_LEN = 20


def make_corpus(n, seed):
    rng = random.Random(seed)
    keywords = {c: list(range(10 + 12 * c, 10 + 12 * c + 12)) for c in range(N_INTENTS)}
    filler = list(range(10 + 12 * N_INTENTS, VOCAB))
    rows = []
    for _ in range(n):
        label = rng.randrange(N_INTENTS)
        length = rng.randint(4, MAX_LEN - 1)
        toks = [rng.choice(filler) for _ in range(length)]
        for _ in range(rng.randint(1, 3)):
            toks[rng.randrange(length)] = rng.choice(keywords[label])
        rows.append(([CLS] + toks, label))
    return rows


class UtteranceDataset(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        toks, label = self.rows[i]
        return torch.tensor(toks), label


def collate(batch):
    lengths = [len(t) for t, _ in batch]
    ids = torch.full((len(batch), max(lengths)), PAD, dtype=torch.long)
    for i, (t, _) in enumerate(batch):
        ids[i, : len(t)] = t
    return ids, torch.tensor([y for _, y in batch])


def make_attention_mask(query_valid, key_valid):
    # [batch, 1, q_len, k_len], True where the query may attend to the key
    return (query_valid[:, None, :, None] & key_valid[:, None, None, :])


class SelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        bias = torch.where(mask, 0.0, -1e10).to(scores.dtype)
        weights = torch.softmax(scores + bias, dim=-1)
        ctx = (weights @ v).transpose(1, 2).reshape(b, t, d)
        return self.out(ctx)


class EncoderLayer(nn.Module):
    def __init__(self, dim, heads, ff):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, ff), nn.GELU(), nn.Linear(ff, dim))

    def forward(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class IntentEncoder(nn.Module):
    def __init__(self, dim=48, heads=4, ff=96, layers=2):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(MAX_LEN, dim)
        self.layers = nn.ModuleList([EncoderLayer(dim, heads, ff) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, N_INTENTS)

    def forward(self, ids):
        valid = ids != PAD
        mask = make_attention_mask(valid, valid)
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for layer in self.layers:
            x = layer(x, mask)
        return self.head(self.ln(x[:, 0]))


def evaluate(model, loader, amp_dtype):
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    with torch.no_grad(), torch.autocast("cpu", dtype=amp_dtype, enabled=amp_dtype != torch.float32):
        for ids, y in loader:
            logits = model(ids).float()
            loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(-1) == y).sum().item()
            total += len(y)
    model.train()
    return loss_sum / total, correct / total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--amp-dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    amp_dtype = getattr(torch, args.amp_dtype)

    torch.manual_seed(0)
    train_loader = DataLoader(UtteranceDataset(make_corpus(768, 1)), batch_size=args.batch_size,
                              shuffle=True, collate_fn=collate)
    val_loader = DataLoader(UtteranceDataset(make_corpus(320, 2)), batch_size=64, collate_fn=collate)

    model = IntentEncoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scaler = torch.amp.GradScaler("cpu", enabled=amp_dtype == torch.float16)

    step = 0
    for epoch in range(args.epochs):
        for ids, y in train_loader:
            with torch.autocast("cpu", dtype=amp_dtype, enabled=amp_dtype != torch.float32):
                logits = model(ids)
            loss = F.cross_entropy(logits.float(), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step:4d} loss {loss.item():.4f}")
            step += 1
        val_loss, val_acc = evaluate(model, val_loader, amp_dtype)
        print(f"epoch {epoch} val_loss {val_loss:.4f} val_acc {val_acc:.3f}")


if __name__ == "__main__":
    main()
