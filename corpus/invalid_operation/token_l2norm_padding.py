"""Sentence classification with bag-of-embeddings: variable-length token lists are padded by a
collate_fn, embedded (padding_idx=0), L2-normalized per token and mean-pooled over the real
tokens.

The padding embedding is all zeros by construction, so the per-token normalization divides 0
by a norm of 0: every padded position is NaN. Masking after the division does not help, since
0 * NaN is still NaN. The normalization needs an epsilon (or F.normalize).
"""

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

VOCAB, PAD = 200, 0


class Sentences(Dataset):
    def __init__(self, n=600, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(3, 15, (1,), generator=g))
            tokens = torch.randint(1, VOCAB, (length,), generator=g)
            label = int((tokens < VOCAB // 2).float().mean() > 0.5)
            self.items.append((tokens, label))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    tokens = pad_sequence([t for t, _ in batch], batch_first=True, padding_value=PAD)
    return tokens, torch.tensor([label for _, label in batch])


class BagOfEmbeddings(nn.Module):
    def __init__(self, dim=32, classes=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.classify = nn.Linear(dim, classes)

    def forward(self, tokens):
        e = self.embed(tokens)
        e = e / e.norm(dim=-1, keepdim=True)
        mask = (tokens != PAD).unsqueeze(-1).float()
        pooled = (e * mask).sum(1) / mask.sum(1)
        return self.classify(pooled)


torch.manual_seed(0)
loader = DataLoader(Sentences(), batch_size=32, shuffle=True, collate_fn=collate)
model = BagOfEmbeddings()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
for epoch in range(3):
    losses = []
    for tokens, labels in loader:
        loss = nn.functional.cross_entropy(model(tokens), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print(f"epoch {epoch} mean loss {sum(losses) / len(losses):.4f}")
