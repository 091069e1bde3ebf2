"""Healthy: sentiment-style sequence classification with a 2-layer LSTM over hand-made
mini-batches, gradient clipping with clip_grad_norm_, and Adam."""

import torch
from torch import nn


class LSTMClassifier(nn.Module):
    def __init__(self, vocab=50, dim=32, hidden=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, num_layers=2, batch_first=True, dropout=0.1)
        self.head = nn.Linear(hidden, 2)

    def forward(self, tokens):
        out, (h, c) = self.lstm(self.embed(tokens))
        return self.head(h[-1])


def make_corpus(n=1024, length=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 50, (n, length), generator=g)
    positive = (tokens < 10).sum(1) > (tokens >= 40).sum(1)  # "good" words vs "bad" words
    return tokens, positive.long()


torch.manual_seed(0)
tokens, labels = make_corpus()
model = LSTMClassifier()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
for epoch in range(3):
    order = torch.randperm(len(tokens))
    for start in range(0, len(tokens), 64):
        idx = order[start : start + 64]
        loss = nn.functional.cross_entropy(model(tokens[idx]), labels[idx])
        optimizer.zero_grad()
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f} grad norm {norm.item():.3f}")
