"""Forecasting the next value of noisy sine waves with a GRU, SGD and OneCycleLR.

OneCycleLR warms the lr up from max_lr/25 to max_lr over the first 30% of the steps. With
Nesterov momentum 0.9, max_lr=0.4 is far too high: as the lr climbs past about 0.1 the updates
overshoot, the forecasts grow geometrically and the MSE overflows around step 40. With
max_lr=0.05 (max_lr / 8) the same run trains.
"""

import torch
from torch import nn


def make_windows(n_series=64, length=400, window=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(length).float()
    freq = 0.02 + 0.08 * torch.rand(n_series, 1, generator=g)
    phase = 6.28 * torch.rand(n_series, 1, generator=g)
    series = 3.0 * torch.sin(freq * t + phase) + 0.1 * torch.randn(n_series, length, generator=g)
    windows = series.unfold(1, window + 1, 4).reshape(-1, window + 1)
    return windows[:, :-1].unsqueeze(-1), windows[:, -1:]


class Forecaster(nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.gru = nn.GRU(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out[:, -1])


def train(steps=100, batch_size=64):
    torch.manual_seed(0)
    inputs, targets = make_windows()
    model = Forecaster()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.4, total_steps=steps)
    for step in range(steps):
        idx = torch.randint(0, len(inputs), (batch_size,))
        loss = nn.functional.mse_loss(model(inputs[idx]), targets[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 10 == 0:
            print(f"step {step} lr {scheduler.get_last_lr()[0]:.3f} loss {loss.item():.4g}")
    return loss.item()


if __name__ == "__main__":
    print("final loss", train())
