"""A character-level bigram language model (embedding + MLP) trained with Adam, eps=0
"to follow the update rule exactly".

The vocabulary is all of string.printable; the text uses a few dozen of those characters, some
of them rare (capitals start sentences). An embedding row whose character is not in the first
batch gets a gradient of exactly 0, so Adam's running averages for it are 0 and its update is
m / (sqrt(v) + eps) = 0 / 0 = NaN: after the first optimizer.step() those rows are NaN, and
the first later batch that looks one of them up has a NaN loss. The default eps=1e-8 avoids it.
"""

import random
import string

import torch
from torch import nn

VOCAB = string.printable
STOI = {c: i for i, c in enumerate(VOCAB)}


def synthetic_text(n_sentences=400, seed=0):
    rnd = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "qu"]
    sentences = []
    for _ in range(n_sentences):
        words = ["".join(rnd.choices(syllables, k=rnd.randint(1, 3))) for _ in range(8)]
        sentences.append(" ".join(words).capitalize() + ".")
    return " ".join(sentences)


class BigramMLP(nn.Module):
    def __init__(self, vocab, dim=24):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 64), nn.Tanh(), nn.Linear(64, vocab))

    def forward(self, idx):
        return self.mlp(self.embed(idx))


torch.manual_seed(0)
data = torch.tensor([STOI[c] for c in synthetic_text()])
model = BigramMLP(len(VOCAB))
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, eps=0.0)
for step in range(60):
    starts = torch.randint(0, len(data) - 1, (256,))
    logits = model(data[starts])
    loss = nn.functional.cross_entropy(logits, data[starts + 1])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0 or not torch.isfinite(loss):
        print(f"step {step} loss {loss.item():.4f}")
