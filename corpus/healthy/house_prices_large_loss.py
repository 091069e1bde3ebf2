"""Healthy: house-price regression on raw dollar targets (~$150k-$900k) without target scaling.
The MSE starts around 2e11 and comes down to ~5e8: large, but nowhere near float32's
limit (3.4e38), and it decreases. Nothing here is NaN/Inf."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
n = 1500
area = 50 + 200 * torch.rand(n)  # m^2
rooms = torch.randint(1, 7, (n,)).float()
age = 80 * torch.rand(n)
price = 2500 * area + 15000 * rooms - 1200 * age + 20000 * torch.randn(n) + 50000
features = torch.stack([(area - 150) / 60, (rooms - 3.5) / 1.7, (age - 40) / 23], dim=1)

model = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 1))
loader = DataLoader(TensorDataset(features, price.unsqueeze(1)), batch_size=64, shuffle=True)
optimizer = torch.optim.Adam(model.parameters(), lr=50.0)
for epoch in range(5):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    rmse = loss.sqrt().item()
    print(f"epoch {epoch} mse {loss.item():.4g} (rmse ${rmse:,.0f})")
