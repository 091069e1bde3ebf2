"""Healthy: PyTorch's default init on Embedding, LSTM, MultiheadAttention, Conv1d + BatchNorm1d,
LayerNorm and Linear layers, a cross-entropy classifier. Must produce no finding above a hint."""

import torch
from torch import nn


class TextClassifier(nn.Module):
    def __init__(self, vocab=50, dim=32, classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, dim, 3, padding=1)
        self.bn = nn.BatchNorm1d(dim)
        self.lstm = nn.LSTM(dim, dim, batch_first=True)
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = torch.relu(self.bn(self.conv(h.transpose(1, 2)))).transpose(1, 2)
        h, _ = self.lstm(h)
        h = self.norm(h + self.attn(h, h, h)[0])
        return self.head(h.mean(dim=1))


torch.manual_seed(0)
model = TextClassifier()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
tokens, labels = torch.randint(0, 50, (16, 12)), torch.randint(0, 4, (16,))
for step in range(10):
    loss = nn.functional.cross_entropy(model(tokens), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
