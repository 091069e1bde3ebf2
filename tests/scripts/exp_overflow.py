"""Planted bug: a hand-rolled softmax exponentiates logits around 100, beyond float32's range."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(10, 5)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
inputs = torch.randn(32, 10) * 100
labels = torch.randint(0, 5, (32,))


def softmax(logits):
    e = torch.exp(logits)
    return e / e.sum(dim=1, keepdim=True)


for step in range(10):
    probs = softmax(model(inputs))
    loss = nn.functional.nll_loss(torch.log(probs + 1e-9), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
