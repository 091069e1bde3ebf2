"""A 6-layer MLP classifier initialized through `model.apply(init_weights)`.

init_weights draws every Linear weight from U(-100, 100), as if the bound were meant in
percent. With fan-in 128 that is about 1000x the default scale per layer, so the logits reach
~1e15 at the first forward pass, the first update is of the same order and the second forward
overflows float32.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def init_weights(module):
    if isinstance(module, nn.Linear):
        nn.init.uniform_(module.weight, -100.0, 100.0)
        nn.init.zeros_(module.bias)


def build_model(d_in=20, width=128, depth=6, classes=5):
    layers = [nn.Linear(d_in, width), nn.ReLU()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


torch.manual_seed(0)
x = torch.randn(1000, 20)
y = (x[:, :5] * torch.arange(1, 6)).argmax(dim=1)
loader = DataLoader(TensorDataset(x, y), batch_size=50, shuffle=True)
model = build_model()
model.apply(init_weights)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for epoch in range(3):
    correct = 0
    for xb, yb in loader:
        logits = model(xb)
        loss = nn.functional.cross_entropy(logits, yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        correct += (logits.argmax(1) == yb).sum().item()
    print(f"epoch {epoch}: loss {loss.item():.4g} acc {correct / len(x):.3f}")
