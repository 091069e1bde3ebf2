"""Part-capsule autoencoder (stacked capsule autoencoder, PCAE stage) on small stroke images.

The decoder explains every pixel with a mixture of Gaussians: one component per
affine-transformed template plus a constant background.  The mixture log-likelihood
is reduced by hand with exp().sum().log() (and the mixing weights are normalised the
same way).  The pixel std is learned and keeps shrinking as the reconstruction
improves; after a few hundred iterations one badly explained pixel has every
component log-density below about -104, exp() underflows to 0 for all of them,
log(0) = -inf makes the loss inf, and the backward pass of log(sum(exp)) is 0/0, so
every parameter is NaN on the next iteration.

Reproduces: https://github.com/mlberkeley/scae-pytorch/pull/4
("fix loss nan bug by using logsumexp()": the loss goes NaN after several epochs
because of the EXP operation in MixtureDistribution.log_prob()).
Fix: torch.logsumexp(logits, 1) in log_prob() (and in mixing_log_prob).
"""
import argparse
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def make_stroke_images(n, size=24, rng=None):
    """'Handwriting' made of 2-3 bars (horizontal / vertical / diagonal)."""
    imgs = np.zeros((n, 1, size, size), dtype=np.float32)
    for i in range(n):
        for _ in range(rng.integers(2, 4)):
            kind = rng.integers(0, 3)
            r, c = rng.integers(3, size - 3, size=2)
            length = rng.integers(5, 10)
            for t in range(length):
                if kind == 0:
                    rr, cc = r, c + t - length // 2
                elif kind == 1:
                    rr, cc = r + t - length // 2, c
                else:
                    rr, cc = r + t - length // 2, c + t - length // 2
                if 0 <= rr < size and 0 <= cc < size:
                    imgs[i, 0, rr, cc] = 1.0
                    if cc + 1 < size:
                        imgs[i, 0, rr, cc + 1] = max(imgs[i, 0, rr, cc + 1], 0.6)
    imgs += rng.normal(0, 0.02, imgs.shape).astype(np.float32)
    return np.clip(imgs, 0.0, 1.0)


def geometric_transform(params):
    """(..., 4) -> (..., 2, 3) similarity transform (scale, rotation, translation)."""
    scale, theta, tx, ty = params.unbind(-1)
    scale = torch.sigmoid(scale) * 0.6 + 0.2
    cos, sin = torch.cos(theta), torch.sin(theta)
    row0 = torch.stack([scale * cos, -scale * sin, tx.tanh()], -1)
    row1 = torch.stack([scale * sin, scale * cos, ty.tanh()], -1)
    return torch.stack([row0, row1], -2)


class MixtureDistribution:
    def __init__(self, mixing_logits, means, scale):
        # mixing_logits, means: (batch, n_components, C, H, W)
        self._mixing_logits = mixing_logits
        self._means = means
        self._components = torch.distributions.Normal(means, scale, validate_args=False)

    @property
    def mixing_log_prob(self):
        return self._mixing_logits - self._mixing_logits.exp().sum(dim=1, keepdim=True).log()

    def log_prob(self, value):
        logits = self._components.log_prob(value.unsqueeze(1))
        logits = logits.sum(dim=2) + self.mixing_log_prob.sum(dim=2)
        logits = logits.exp().sum(dim=1).log()
        return logits

    def mean(self):
        return (self._means * torch.softmax(self._mixing_logits, dim=1)).sum(dim=1)


class CapsuleImageEncoder(nn.Module):
    def __init__(self, n_caps):
        super().__init__()
        self.n_caps = n_caps
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, stride=2, padding=1), nn.ReLU(), nn.BatchNorm2d(32),
            nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU(), nn.BatchNorm2d(32),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(32),
        )
        self.feat = nn.Conv2d(32, n_caps * 5, 1)
        self.attn = nn.Conv2d(32, n_caps, 1)

    def forward(self, x):
        b = x.shape[0]
        h = self.net(x)
        a = torch.softmax(self.attn(h).view(b, self.n_caps, 1, -1), dim=-1)
        f = self.feat(h).view(b, self.n_caps, 5, -1)
        preds = (f * a).sum(-1)
        pose_params, presence_logit = preds.split([4, 1], dim=-1)
        return geometric_transform(pose_params), torch.sigmoid(presence_logit.squeeze(-1))


class TemplateImageDecoder(nn.Module):
    def __init__(self, n_caps, template_size=9, output_size=24, init_pixel_std=0.1):
        super().__init__()
        self.n_caps = n_caps
        self.output_size = output_size
        self.templates = nn.Parameter(torch.randn(n_caps, 1, template_size, template_size))
        self.temperature_logit = nn.Parameter(torch.zeros(1))
        self.bg_value = nn.Parameter(torch.zeros(1))
        self.log_pixel_std = nn.Parameter(torch.tensor(float(np.log(init_pixel_std))))

    def forward(self, poses, presences):
        b = poses.shape[0]
        grid = F.affine_grid(poses.view(-1, 2, 3), (b * self.n_caps, 1, self.output_size, self.output_size),
                             align_corners=False)
        templates = torch.sigmoid(self.templates).repeat(b, 1, 1, 1)
        tt = F.grid_sample(templates, grid, align_corners=False)
        tt = tt.view(b, self.n_caps, 1, self.output_size, self.output_size)

        temperature = F.softplus(self.temperature_logit + 0.5) + 1e-4
        tt_logits = tt / temperature + torch.log(presences.view(b, self.n_caps, 1, 1, 1) + 1e-16)
        bg = torch.sigmoid(self.bg_value).expand(b, 1, 1, self.output_size, self.output_size)
        mixture_logits = torch.cat([tt_logits, bg / temperature], dim=1)
        mixture_means = torch.cat([tt, bg], dim=1)
        return MixtureDistribution(mixture_logits, mixture_means, self.log_pixel_std.exp())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--num-caps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=24)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--n-train", type=int, default=1024)
    args = p.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)
    rng = np.random.default_rng(0)
    images = torch.from_numpy(make_stroke_images(args.n_train, rng=rng))

    encoder = CapsuleImageEncoder(args.num_caps)
    decoder = TemplateImageDecoder(args.num_caps)
    opt = torch.optim.Adam(list(encoder.parameters()) + list(decoder.parameters()), lr=args.lr)

    step = 0
    for epoch in range(args.epochs):
        perm = torch.randperm(args.n_train)
        for i in range(0, args.n_train, args.batch_size):
            img = images[perm[i:i + args.batch_size]]
            poses, presences = encoder(img)
            pdf = decoder(poses, presences)
            rec_ll = pdf.log_prob(img).view(img.shape[0], -1).sum(-1).mean()
            temp_l1 = F.relu(decoder.templates).mean()
            loss = -rec_ll + 0.01 * temp_l1

            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 10 == 0:
                with torch.no_grad():
                    mse = F.mse_loss(pdf.mean(), img)
                print(f"epoch {epoch:2d} step {step:4d}  loss {loss.item():10.3f}  rec_mse {mse.item():.4f}"
                      f"  pixel_std {decoder.log_pixel_std.exp().item():.4f}")
            step += 1


if __name__ == "__main__":
    main()
