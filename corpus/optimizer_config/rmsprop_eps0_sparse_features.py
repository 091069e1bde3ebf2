"""Spam filtering with hashed bag-of-words features and a linear model, trained with RMSprop
(eps=0) over hand-sliced mini-batches, logging to a file.

With 512 hash buckets and a small vocabulary, many buckets never fire: their feature column is
always 0, so the matching weights get a gradient of exactly 0. RMSprop divides by
sqrt(avg(g^2)) + eps = 0 for them, giving 0 / 0 = NaN weights after the first step, and since
0 * NaN = NaN in the next matmul the logits and the loss are NaN. eps=1e-8 (the default) fixes it.
"""

import logging
import zlib

import torch
from torch import nn

logging.basicConfig(filename="spam.log", filemode="w", level=logging.INFO)
BUCKETS = 512
HAM = ["meeting", "tomorrow", "lunch", "project", "report", "thanks", "call", "notes"]
SPAM = ["winner", "free", "prize", "click", "now", "offer", "cash", "claim", "urgent"]


def featurize(words):
    x = torch.zeros(BUCKETS)
    for w in words:
        x[zlib.crc32(w.encode()) % BUCKETS] += 1.0
    return x


gen = torch.Generator().manual_seed(0)
messages, labels = [], []
for i in range(1200):
    spam = i % 3 == 0
    pool = SPAM + HAM[:4] if spam else HAM + SPAM[:2]
    picks = torch.randint(0, len(pool), (8,), generator=gen)
    messages.append(featurize([pool[j] for j in picks]))
    labels.append(float(spam))
X, y = torch.stack(messages), torch.tensor(labels)

torch.manual_seed(0)
model = nn.Linear(BUCKETS, 1)
optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3, eps=0.0)
loss_fn = nn.BCEWithLogitsLoss()
for epoch in range(4):
    perm = torch.randperm(len(X))
    for b in range(0, len(X), 100):
        idx = perm[b : b + 100]
        loss = loss_fn(model(X[idx]).squeeze(1), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    logging.info("epoch %d loss %.4f", epoch, loss.item())
    print(f"epoch {epoch} loss {loss.item():.4f}")
