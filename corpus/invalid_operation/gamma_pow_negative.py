"""Low-light image enhancement: a small CNN predicts a linear-light image, which is gamma-encoded
with x ** (1 / 2.2) and compared with the sRGB target. Organized as a Trainer class with a
StepLR schedule.

The CNN's last layer is a plain convolution, so some predicted intensities are negative, and a
negative number to a fractional power is NaN. The gamma curve needs its input clamped to >= 0
(or a sigmoid/softplus output).
"""

import torch
import torch.nn.functional as F
from torch import nn

GAMMA = 2.2


class Enhancer(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 3, 3, padding=1),
        )

    def forward(self, dark):
        linear = dark + self.net(dark)
        return linear.pow(1.0 / GAMMA)


class Trainer:
    def __init__(self, model, lr=1e-3):
        self.model = model
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=20, gamma=0.5)

    def step(self, dark, target):
        loss = F.l1_loss(self.model(dark), target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        return loss.item()


def synthetic_pair(n, size=24, generator=None):
    bright = torch.rand(n, 3, size, size, generator=generator)
    dark = 0.1 * bright + 0.01 * torch.randn(n, 3, size, size, generator=generator)
    return dark, bright ** (1.0 / GAMMA)


if __name__ == "__main__":
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    trainer = Trainer(Enhancer())
    for it in range(40):
        loss = trainer.step(*synthetic_pair(8, generator=gen))
        if it % 5 == 0:
            print(f"iter {it} l1 {loss:.4f}")
