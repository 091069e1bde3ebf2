"""Cosine-prototype classifier for 1-D sensor windows (human-activity style).

A small temporal CNN embeds each window; the head keeps one learnable prototype per
activity and scores classes by scaled cosine similarity (NormFace-style).  Weights are
initialised with a Kaiming helper applied through model.apply().
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Encoder(nn.Module):
    def __init__(self, in_ch, dim):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(in_ch, 64, 5, padding=2), nn.BatchNorm1d(64), nn.ReLU(),
            nn.Conv1d(64, 128, 5, padding=2, stride=2), nn.BatchNorm1d(128), nn.ReLU(),
            nn.AdaptiveAvgPool1d(1), nn.Flatten(),
            nn.Linear(128, dim),
        )

    def forward(self, x):
        return self.net(x)


class CosinePrototypeHead(nn.Module):
    def __init__(self, dim, n_classes, scale=16.0):
        super().__init__()
        self.prototypes = nn.Parameter(torch.empty(n_classes, dim))
        self.scale = scale

    def forward(self, feats):
        f = feats / feats.norm(dim=1, keepdim=True).clamp_min(1e-6)
        p = self.prototypes / self.prototypes.norm(dim=1, keepdim=True)
        return self.scale * f @ p.t()


class ActivityNet(nn.Module):
    def __init__(self, in_ch, dim, n_classes):
        super().__init__()
        self.encoder = Encoder(in_ch, dim)
        self.head = CosinePrototypeHead(dim, n_classes)

    def forward(self, x):
        return self.head(self.encoder(x))


def init_weights(m):
    if isinstance(m, (nn.Conv1d, nn.Linear)):
        nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.BatchNorm1d):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


def make_windows(n, n_classes, in_ch, length, gen):
    t = torch.linspace(0, 1, length)
    freqs = 1 + torch.rand(n_classes, in_ch, generator=gen) * 8
    amps = 0.5 + torch.rand(n_classes, in_ch, generator=gen)
    y = torch.randint(0, n_classes, (n,), generator=gen)
    phase = 6.28 * torch.rand(n, in_ch, 1, generator=gen)
    x = amps[y].unsqueeze(-1) * torch.sin(6.28 * freqs[y].unsqueeze(-1) * t + phase)
    x = x + 0.3 * torch.randn(n, in_ch, length, generator=gen)
    return x, y


def main():
    torch.manual_seed(0)
    in_ch, dim, n_classes = 6, 512, 120
    model = ActivityNet(in_ch, dim, n_classes)
    model.apply(init_weights)

    gen = torch.Generator().manual_seed(0)
    x, y = make_windows(1536, n_classes, in_ch, 64, gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)

    bs = 64
    for epoch in range(2):
        perm = torch.randperm(len(x), generator=gen)
        for it in range(len(x) // bs):
            idx = perm[it * bs : (it + 1) * bs]
            logits = model(x[idx])
            loss = F.cross_entropy(logits, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if it % 6 == 0:
                acc = (logits.argmax(1) == y[idx]).float().mean().item()
                print(f"epoch {epoch} it {it:2d} loss {loss.item():.4f} acc {acc:.3f}")


if __name__ == "__main__":
    main()
