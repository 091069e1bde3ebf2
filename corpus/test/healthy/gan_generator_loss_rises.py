"""1-D GAN (mixture of two Gaussians) with the non-saturating BCE losses.

As the discriminator gets better the generator loss climbs from ~0.7 to above 1 and
oscillates -- normal adversarial dynamics, not divergence.  Everything stays finite and the
generated samples move towards the two modes.
"""
import torch
import torch.nn as nn

torch.manual_seed(0)


def real_samples(n):
    mode = torch.randint(0, 2, (n, 1)).float()
    return mode * 4.0 - 2.0 + 0.3 * torch.randn(n, 1)


G = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
D = nn.Sequential(nn.Linear(1, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()

for it in range(250):
    real = real_samples(128)
    fake = G(torch.randn(128, 4))
    d_loss = bce(D(real), torch.ones(128, 1)) + bce(D(fake.detach()), torch.zeros(128, 1))
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()

    g_loss = bce(D(fake), torch.ones(128, 1))
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
    if it % 25 == 0:
        with torch.no_grad():
            s = G(torch.randn(1000, 4))
        print(f"it {it:3d}  D {d_loss.item():.3f}  G {g_loss.item():.3f}  "
              f"fake mean {s.mean().item():+.2f}  frac>0 {(s > 0).float().mean().item():.2f}")
