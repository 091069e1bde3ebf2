"""Least-squares GAN on 8x8 "sprites"; the custom weights_init swaps mean and std for conv layers.

The DCGAN recipe (see the PyTorch forum thread "DCGAN Tutorial: Weight Initialisation",
https://discuss.pytorch.org/t/dcgan-tutorial-weight-initialisation/32585) initialises conv
weights from N(0, 0.02) and BatchNorm gammas from N(1, 0.02).  This script copied the
BatchNorm line for the conv layers as well, ``nn.init.normal_(m.weight, 1.0, 0.02)``, so every
conv kernel starts as an all-positive ~1.0 filter.  Each layer then multiplies the activation
scale by its fan-in (hundreds); with no BatchNorm in this small network the discriminator
output of D(G(z)) is ~1e20 on the first batch, the least-squares loss squares it to inf and
the inf/NaN gradients turn the losses into nan a few iterations later.

Fix: ``nn.init.normal_(m.weight, 0.0, 0.02)`` for Conv / ConvTranspose layers.
"""
import torch
import torch.nn as nn

torch.manual_seed(0)
NZ = 16


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


netG = nn.Sequential(
    nn.ConvTranspose2d(NZ, 64, 4, 1, 0), nn.ReLU(),          # 4x4
    nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.ReLU(),          # 8x8
    nn.Conv2d(32, 1, 3, 1, 1), nn.Tanh(),
)
netD = nn.Sequential(
    nn.Conv2d(1, 64, 3, 1, 1), nn.LeakyReLU(0.2),
    nn.Conv2d(64, 64, 3, 1, 1), nn.LeakyReLU(0.2),
    nn.Conv2d(64, 64, 4, 2, 1), nn.LeakyReLU(0.2),           # 4x4
    nn.Conv2d(64, 64, 3, 1, 1), nn.LeakyReLU(0.2),
    nn.Conv2d(64, 64, 3, 1, 1), nn.LeakyReLU(0.2),
    nn.Conv2d(64, 64, 3, 1, 1), nn.LeakyReLU(0.2),
    nn.Conv2d(64, 64, 3, 1, 1), nn.LeakyReLU(0.2),
    nn.Conv2d(64, 1, 4, 1, 0),                              # 1x1 score
)
netG.apply(weights_init)
netD.apply(weights_init)

optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
mse = nn.MSELoss()


def real_batch(n=8):
    img = -torch.ones(n, 1, 8, 8)
    r = torch.randint(1, 6, (n,))
    for i in range(n):
        img[i, 0, r[i]:r[i] + 2, 1:7] = 1.0                    # horizontal bars
    return img


for it in range(12):
    real = real_batch()
    z = torch.randn(real.size(0), NZ, 1, 1)
    fake = netG(z)

    d_real = netD(real).view(-1)
    d_fake = netD(fake.detach()).view(-1)
    lossD = 0.5 * (mse(d_real, torch.ones_like(d_real)) + mse(d_fake, torch.zeros_like(d_fake)))
    optD.zero_grad()
    lossD.backward()
    optD.step()

    d_gen = netD(fake).view(-1)
    lossG = 0.5 * mse(d_gen, torch.ones_like(d_gen))
    optG.zero_grad()
    lossG.backward()
    optG.step()
    print(f"[{it}] loss_D {lossD.item():.4f}  loss_G {lossG.item():.4f}")
