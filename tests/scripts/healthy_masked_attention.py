"""Healthy: causal attention built with masked_fill(-inf) before softmax, nn.MultiheadAttention
with a key padding mask, and a TransformerEncoderLayer with a square subsequent mask. The -inf
values are intentional and never reach the loss: no cause must be reported."""

import math

import torch
from torch import nn

torch.manual_seed(0)
T, D = 8, 16


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        return self.proj(torch.softmax(scores, dim=-1) @ v)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = CausalSelfAttention()
        self.mha = nn.MultiheadAttention(D, 2, batch_first=True)
        self.block = nn.TransformerEncoderLayer(
            D, 2, dim_feedforward=32, batch_first=True, dropout=0.0
        )
        self.head = nn.Linear(D, 1)

    def forward(self, x, padding):
        x = x + self.attn(x)
        x = x + self.mha(x, x, x, key_padding_mask=padding)[0]
        causal = nn.Transformer.generate_square_subsequent_mask(T)
        x = self.block(x, src_mask=causal, is_causal=True)
        return self.head(x).squeeze(-1)


model = Model()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(4, T, D), torch.randn(4, T)
padding = torch.zeros(4, T, dtype=torch.bool)
padding[:, -2:] = True  # the last two positions are padding
for step in range(10):
    loss = nn.functional.mse_loss(model(x, padding), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
