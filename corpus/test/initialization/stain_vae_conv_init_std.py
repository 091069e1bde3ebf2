"""Conditional stain-transfer VAE (HistAuGAN / MDMM style) whose conv init uses std 0.2.

Source: sophiajw/HistAuGAN pull request #4, "Fixing training crash caused by 'inf'"
(https://github.com/sophiajw/HistAuGAN/pull/4), merged by the maintainer.  The helper
``gaussian_weights_init`` that is ``.apply()``-ed to every sub-network drew Conv / ConvTranspose
weights from N(0, 0.2) instead of the intended N(0, 0.02).  The attribute encoder is a stack of
residual conv blocks with LeakyReLU and no normalisation, so with std 0.2 each 3x3 conv
multiplies the activation scale by roughly 0.2 * sqrt(9 * C_in) (5-10x); after a few blocks the
pooled features are ~1e4, the ``logvar`` head outputs thousands, ``exp(0.5 * logvar)`` overflows
to inf, the sampled attribute code is +-inf, and the KL + reconstruction loss is nan from the
first iteration (the PR describes the training crashing with NaN / +-inf).

Here the same recipe is trained on synthetic H&E-like tiles from three "scanner" domains.
Fix (the merged PR): ``torch.nn.init.normal_(m.weight, 0., 0.02)``.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(3)

N_DOMAINS = 3
NZ = 8
IMG = 32


def gaussian_weights_init(m):
    classname = m.__class__.__name__
    if classname.find('Conv') == 0:
        torch.nn.init.normal_(m.weight, 0., 0.2)


class ResDown(nn.Module):
    """lrelu -> conv3x3 -> lrelu -> conv3x3 -> avgpool, plus pooled 1x1 shortcut (no norm)."""

    def __init__(self, cin, cout):
        super().__init__()
        self.body = nn.Sequential(
            nn.LeakyReLU(0.2),
            nn.ReflectionPad2d(1), nn.Conv2d(cin, cin, 3),
            nn.LeakyReLU(0.2),
            nn.ReflectionPad2d(1), nn.Conv2d(cin, cout, 3),
            nn.AvgPool2d(2),
        )
        self.skip = nn.Sequential(nn.AvgPool2d(2), nn.Conv2d(cin, cout, 1))

    def forward(self, x):
        return self.body(x) + self.skip(x)


class AttrEncoder(nn.Module):
    def __init__(self, in_ch=3, c_dim=N_DOMAINS, nz=NZ):
        super().__init__()
        ndf = 64
        self.conv = nn.Sequential(
            nn.ReflectionPad2d(1), nn.Conv2d(in_ch + c_dim, ndf, 4, 2),   # 16x16
            ResDown(ndf, ndf * 2),                                         # 8x8
            ResDown(ndf * 2, ndf * 4),                                     # 4x4
            ResDown(ndf * 4, ndf * 4),                                     # 2x2
            nn.LeakyReLU(0.2), nn.AdaptiveAvgPool2d(1),
        )
        self.fc_mu = nn.Linear(ndf * 4, nz)
        self.fc_logvar = nn.Linear(ndf * 4, nz)

    def forward(self, x, c):
        c_map = c.view(c.size(0), c.size(1), 1, 1).expand(-1, -1, x.size(2), x.size(3))
        h = self.conv(torch.cat([x, c_map], 1)).flatten(1)
        return self.fc_mu(h), self.fc_logvar(h)


class ContentEncoder(nn.Module):
    def __init__(self, in_ch=3):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_ch, 32, 5, 1, 2), nn.LeakyReLU(0.2),
            nn.Conv2d(32, 64, 3, 2, 1), nn.InstanceNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, 2, 1), nn.InstanceNorm2d(128), nn.ReLU(),
        )

    def forward(self, x):
        return self.net(x)


class Generator(nn.Module):
    def __init__(self, out_ch=3, c_dim=N_DOMAINS, nz=NZ):
        super().__init__()
        ch = 128 + c_dim + nz
        self.up = nn.Sequential(
            nn.ConvTranspose2d(ch, 64, 3, 2, 1, output_padding=1), nn.InstanceNorm2d(64), nn.ReLU(),
            nn.ConvTranspose2d(64, 32, 3, 2, 1, output_padding=1), nn.InstanceNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, out_ch, 1), nn.Tanh(),
        )

    def forward(self, content, z, c):
        h, w = content.shape[2:]
        zc = torch.cat([c, z], 1).view(content.size(0), -1, 1, 1).expand(-1, -1, h, w)
        return self.up(torch.cat([content, zc], 1))


def make_tiles(n):
    """Blobby 'nuclei on stroma' tiles; each domain has its own stain colour cast."""
    stain = torch.tensor([[0.55, 0.25, 0.60], [0.75, 0.35, 0.55], [0.45, 0.30, 0.75]])
    dom = torch.randint(0, N_DOMAINS, (n,))
    noise = torch.rand(n, 1, IMG // 4, IMG // 4)
    nuclei = F.interpolate(noise, size=(IMG, IMG), mode='bilinear', align_corners=False)
    nuclei = (nuclei > 0.6).float()
    base = stain[dom].view(n, 3, 1, 1)
    img = base * (1.0 - 0.5 * nuclei) + 0.05 * torch.randn(n, 3, IMG, IMG)
    return img.clamp(0, 1) * 2 - 1, F.one_hot(dom, N_DOMAINS).float()


def main():
    images, domains = make_tiles(256)

    enc_c, enc_a, gen = ContentEncoder(), AttrEncoder(), Generator()
    for net in (enc_c, enc_a, gen):
        net.apply(gaussian_weights_init)

    params = list(enc_c.parameters()) + list(enc_a.parameters()) + list(gen.parameters())
    opt = torch.optim.Adam(params, lr=1e-4, betas=(0.5, 0.999), weight_decay=1e-4)

    batch_size = 16
    for it in range(30):
        idx = torch.randint(0, images.size(0), (batch_size,))
        x, c = images[idx], domains[idx]

        z_content = enc_c(x)
        mu, logvar = enc_a(x, c)
        std = torch.exp(logvar.mul(0.5))
        z_attr = mu + std * torch.randn_like(std)
        x_rec = gen(z_content, z_attr, c)

        loss_rec = F.l1_loss(x_rec, x) * 10
        loss_kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) * 0.01
        loss = loss_rec + loss_kl

        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"it {it:3d}  loss {loss.item():.4f}  rec {loss_rec.item():.4f}  "
              f"kl {loss_kl.item():.4f}  max|logvar| {logvar.abs().max().item():.3e}")


if __name__ == "__main__":
    main()
