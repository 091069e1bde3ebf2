"""Classifying long noisy sequences (400 steps) with a single-layer tanh RNN, echo-state style:
the recurrent matrix is rescaled to spectral radius 4 "for long memory".

The forward pass is well behaved (tanh keeps every state in [-1, 1] and the loss is ~1), but
with that recurrent gain the dynamics are chaotic, and backpropagation through 400 time steps
multiplies the gradient by a Jacobian of norm > 1 at every step: it grows exponentially and
overflows float32 (inf, then inf - inf = NaN) in the very first backward pass. Shorter truncated-BPTT windows, a smaller
recurrent gain or an LSTM avoid it.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class SequenceClassifier(nn.Module):
    def __init__(self, n_in=3, hidden=64, classes=3, spectral_radius=4.0):
        super().__init__()
        self.rnn = nn.RNN(n_in, hidden, nonlinearity="tanh", batch_first=True)
        with torch.no_grad():
            w = self.rnn.weight_hh_l0
            w.normal_()
            w.mul_(spectral_radius / torch.linalg.eigvals(w).abs().max())
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        states, _ = self.rnn(x)
        return self.head(states[:, -1])


def make_sequences(n=256, length=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=g)
    t = torch.arange(length).float()
    base = torch.sin(0.05 * (labels.float() + 1)[:, None] * t)
    x = torch.stack([base, torch.cos(base), torch.randn(n, length, generator=g)], dim=-1)
    return TensorDataset(x, labels)


torch.manual_seed(0)
loader = DataLoader(make_sequences(), batch_size=32, shuffle=True)
model = SequenceClassifier()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for epoch in range(2):
    for i, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
        optimizer.step()
        print(f"epoch {epoch} batch {i} loss {loss.item():.4f} grad norm {grad_norm.item():.3g}")
