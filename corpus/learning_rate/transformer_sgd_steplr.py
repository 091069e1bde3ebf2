"""Predicting the running mean of a token sequence with a tiny Transformer encoder, trained
with SGD + momentum and a StepLR schedule in one flat loop.

The initial lr of 0.5 is far too large for this regression: the loss grows 2x, 3x, then by
orders of magnitude per step and is NaN by step 5, long before the first StepLR decay at
step 50. With lr=0.5/8 the run trains.
"""

import torch
from torch import nn

torch.manual_seed(0)
vocab, seq_len, d_model = 32, 12, 32
values = torch.linspace(-4, 4, vocab)

embed = nn.Embedding(vocab, d_model)
pos = nn.Parameter(0.02 * torch.randn(seq_len, d_model))
layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=64, batch_first=True)
encoder = nn.TransformerEncoder(layer, num_layers=2)
head = nn.Linear(d_model, 1)
params = [*embed.parameters(), pos, *encoder.parameters(), *head.parameters()]

optimizer = torch.optim.SGD(params, lr=0.5, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.1)
for step in range(120):
    tokens = torch.randint(0, vocab, (32, seq_len))
    target = values[tokens].cumsum(1) / torch.arange(1, seq_len + 1)
    hidden = encoder(embed(tokens) + pos)
    pred = head(hidden).squeeze(-1)
    loss = ((pred - target) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    if step % 10 == 0 or not loss.isfinite():
        print(f"step {step} loss {loss.item():.4g}")
