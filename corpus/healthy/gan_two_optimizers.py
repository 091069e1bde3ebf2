"""Healthy: a GAN learning a 2-D ring of Gaussians, with separate Adam optimizers for the
generator and the discriminator, BCEWithLogitsLoss, and detach() for the discriminator step."""

import math

import torch
from torch import nn


def real_samples(n, generator):
    k = torch.randint(0, 8, (n,), generator=generator).float()
    angle = 2 * math.pi * k / 8
    centers = torch.stack([angle.cos(), angle.sin()], dim=1) * 2.0
    return centers + 0.05 * torch.randn(n, 2, generator=generator)


class Generator(nn.Module):
    def __init__(self, z_dim=8):
        super().__init__()
        self.z_dim = z_dim
        self.net = nn.Sequential(
            nn.Linear(z_dim, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2)
        )

    def forward(self, z):
        return self.net(z)


torch.manual_seed(0)
gen_rng = torch.Generator().manual_seed(0)
G = Generator()
D = nn.Sequential(
    nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1)
)
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()
ones, zeros = torch.ones(128, 1), torch.zeros(128, 1)
for it in range(150):
    real = real_samples(128, gen_rng)
    fake = G(torch.randn(128, G.z_dim))

    d_loss = bce(D(real), ones) + bce(D(fake.detach()), zeros)
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()

    g_loss = bce(D(fake), ones)
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
    if it % 25 == 0:
        print(f"iter {it} d_loss {d_loss.item():.4f} g_loss {g_loss.item():.4f}")
