"""Planted bug that appears only compiled: under torch.compile the forward takes a path eager
never runs. It stands in for a compiler that computes softmax without subtracting the max; the
"eager" backend makes it run anywhere, with no C compiler."""

import torch
from torch import nn

torch.manual_seed(0)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.fc(x)
        if torch.compiler.is_compiling():
            e = torch.exp(logits)  # overflows once a logit passes 88.7
            return torch.log(e / e.sum(dim=1, keepdim=True))
        return torch.log_softmax(logits, dim=1)


model = torch.compile(Classifier(), backend="eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 8)
y = torch.randint(0, 4, (32,))
for step in range(8):
    batch = x * (100.0 if step >= 3 else 1.0)  # unnormalized features from step 3 on
    loss = nn.functional.nll_loss(model(batch), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
