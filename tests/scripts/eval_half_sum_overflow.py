"""Planted bug: the model trains in float32, then is evaluated in float16 (`model.half()`, to
halve the memory of inference). The evaluation's smoothing term sums the negative
log-probabilities over the 16,384-word vocabulary (about 9.7 each, 1.6e5 in all), past float16's
largest value 65504: the final evaluation loss is inf, although training never saw a NaN/Inf."""

import torch
from torch import nn

torch.manual_seed(0)
VOCAB = 16384
model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Linear(32, VOCAB))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
tokens = torch.randint(0, VOCAB, (64, 8))
for step in range(12):
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")

model.half()  # evaluate in float16
with torch.no_grad():
    lprobs = model(tokens[:, :-1]).log_softmax(dim=-1)
    smooth_loss = -lprobs.sum(dim=-1)  # summed over the vocabulary
    eval_loss = smooth_loss.mean() / VOCAB
print(f"eval loss {eval_loss.item():.4f}")
