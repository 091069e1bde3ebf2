"""A deep & cross network on features where a handful of rows lie far out in the tail.

The stacked cross layers make the logit a degree-4 polynomial of the input, so the batch that
holds a far-out row has a gradient hundreds of times the usual at any learning rate: at the
same steps (the same batches) whatever the rate. At lr 0.015 the update one such batch drives
throws the weights far enough that the next steps run away and the loss is NaN near step 144;
smaller rates only shrink that update. Clipping the gradient norm bounds it and keeps the rate.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
N, D = 4096, 8
x = torch.randn(N, D)
x[torch.randperm(N)[:6]] *= 8.0  # a few rows far out in the tail
y = ((x[:, 0] * x[:, 1]) > 0).float()


class CrossNetwork(nn.Module):
    def __init__(self, depth=3):
        super().__init__()
        self.w = nn.ParameterList([nn.Parameter(torch.randn(D) * 0.1) for _ in range(depth)])
        self.b = nn.ParameterList([nn.Parameter(torch.zeros(D)) for _ in range(depth)])
        self.head = nn.Linear(D, 1)

    def forward(self, x0):
        xl = x0
        for w, b in zip(self.w, self.b, strict=True):
            xl = x0 * (xl @ w).unsqueeze(1) + b + xl
        return self.head(xl).squeeze(1)


model = CrossNetwork()
optimizer = torch.optim.SGD(model.parameters(), lr=0.015, momentum=0.9)
dataset = torch.utils.data.TensorDataset(x, y)
loader = torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True)
step = 0
for epoch in range(3):
    for features, target in loader:
        loss = F.binary_cross_entropy_with_logits(model(features), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.4f}")
        step += 1
