"""Bag-of-words text classifier trained with Adam(eps=0).

eps = 0 was set to make the optimizer "exact" (the same question came up for optax in
google-deepmind/optax#1553, https://github.com/google-deepmind/optax/pull/1553: the
zero-gradient stability test "only passes if the eps is non-zero" -- with eps == 0 a
parameter whose gradient is exactly zero gets the update m / (sqrt(v) + eps) = 0 / 0).

Every embedding row that does not occur in the first batch has a gradient of exactly zero,
so after the first optimizer step all those rows are NaN; the next batch that looks one of
them up produces a NaN loss.  Fix: keep Adam's default eps=1e-8 (or larger).
"""
import torch
import torch.nn as nn

torch.manual_seed(0)
VOCAB, DIM, CLASSES = 500, 32, 4


class BowClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(VOCAB, DIM, mode="mean")
        self.fc = nn.Linear(DIM, CLASSES)

    def forward(self, tokens, offsets):
        return self.fc(self.emb(tokens, offsets))


def make_docs(n=800):
    docs, labels = [], []
    for _ in range(n):
        label = int(torch.randint(0, CLASSES, (1,)))
        topic_words = torch.randint(label * 100, label * 100 + 100, (6,))
        common = torch.randint(400, VOCAB, (4,))
        docs.append(torch.cat([topic_words, common]))
        labels.append(label)
    return docs, torch.tensor(labels)


docs, labels = make_docs()
model = BowClassifier()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=0.0)
loss_fn = nn.CrossEntropyLoss()

for step in range(50):
    idx = torch.randint(0, len(docs), (16,))
    batch = [docs[i] for i in idx.tolist()]
    offsets = torch.tensor([0] + [len(d) for d in batch[:-1]]).cumsum(0)
    logits = model(torch.cat(batch), offsets)
    loss = loss_fn(logits, labels[idx])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step:2d}  loss {loss.item():.4f}")
