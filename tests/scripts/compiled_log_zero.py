"""Planted bug in a compiled forward that fails eagerly too: from step 3 on, the batch is 1000x
larger, the softmax saturates and some probabilities under the log are exactly 0."""

import torch
from torch import nn

torch.manual_seed(0)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    @torch.compile(backend="aot_eager")
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.net(x), dim=1)
        return torch.log(probs)


model = Classifier()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 8)
y = torch.randint(0, 4, (32,))
for step in range(8):
    batch = x * (1000.0 if step >= 3 else 1.0)  # unnormalized features from step 3 on
    loss = nn.functional.nll_loss(model(batch), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
