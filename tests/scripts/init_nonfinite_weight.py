"""A regression MLP restored from a state dict in which one weight holds NaN."""

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
state = model.state_dict()
state["2.weight"][0, 3] = float("nan")
model.load_state_dict(state)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(5):
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
