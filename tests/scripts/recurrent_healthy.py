"""Healthy: a GRU over 12 time steps and a hand-written Elman cell fed its own hidden state,
one character at a time, as in the char-RNN tutorials."""

import torch
from torch import nn


class ElmanCell(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.i2h = nn.Linear(2 * size, size)

    def forward(self, x, hidden):
        hidden = torch.tanh(self.i2h(torch.cat([x, hidden], dim=1)))
        return hidden, hidden


torch.manual_seed(0)
gru = nn.GRU(8, 8, batch_first=True)
cell = ElmanCell(8)
optimizer = torch.optim.Adam([*gru.parameters(), *cell.parameters()], lr=1e-3)
x = torch.randn(16, 12, 8)
for step in range(5):
    out, _ = gru(x)
    hidden = torch.zeros(16, 8)
    for t in range(12):
        output, hidden = cell(out[:, t], hidden)
    loss = output.pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
