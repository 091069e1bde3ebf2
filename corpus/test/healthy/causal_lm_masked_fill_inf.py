"""Tiny causal transformer language model; the attention mask uses masked_fill(-inf).

The causal mask fills future positions with float('-inf') before the softmax -- the pattern
used by nn.Transformer.generate_square_subsequent_mask.  Every query row keeps at least its
own position unmasked, so the softmax never sees an all -inf row and the run trains cleanly
on a repeating token pattern.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
VOCAB, D, T = 16, 32, 24


class CausalSelfAttention(nn.Module):
    def __init__(self, d, heads=4):
        super().__init__()
        self.h = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.h)
        att = att.masked_fill(self.mask[:t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.zeros(1, T, D))
        self.blocks = nn.Sequential(Block(D), Block(D))
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx):
        return self.head(self.blocks(self.tok(idx) + self.pos[:, :idx.size(1)]))


def get_batch(n=16):
    start = torch.randint(0, VOCAB, (n, 1))
    step = torch.randint(1, 4, (n, 1))
    seq = (start + step * torch.arange(T + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


model = TinyGPT()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
for it in range(80):
    x, y = get_batch()
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if it % 10 == 0:
        print(f"iter {it:3d}  loss {loss.item():.4f}")
print("final loss", round(loss.item(), 4))
