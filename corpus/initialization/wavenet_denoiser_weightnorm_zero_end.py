"""WaveNet-style residual denoiser for 1-D signals.

Dilated gated conv blocks (WaveGlow "WN" layout) predict a correction that is added
to the noisy input.  Every conv is weight-normalised, and the output projection is
zero-initialised so that the network starts as the identity mapping.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import weight_norm


def wn_conv(in_ch, out_ch, kernel_size=1, dilation=1):
    pad = dilation * (kernel_size - 1) // 2
    return weight_norm(nn.Conv1d(in_ch, out_ch, kernel_size, dilation=dilation, padding=pad))


class WN(nn.Module):
    def __init__(self, channels=1, hidden=32, n_layers=5, kernel_size=3):
        super().__init__()
        self.hidden = hidden
        self.start = wn_conv(channels, hidden)
        self.in_layers = nn.ModuleList()
        self.res_skip = nn.ModuleList()
        for i in range(n_layers):
            self.in_layers.append(wn_conv(hidden, 2 * hidden, kernel_size, dilation=2 ** i))
            out = 2 * hidden if i < n_layers - 1 else hidden
            self.res_skip.append(wn_conv(hidden, out))
        end = nn.Conv1d(hidden, channels, 1)
        end.weight.data.zero_()
        end.bias.data.zero_()
        self.end = weight_norm(end)

    def forward(self, x):
        h = self.start(x)
        skip = 0
        for i, (inl, rs) in enumerate(zip(self.in_layers, self.res_skip)):
            a, b = inl(h).chunk(2, dim=1)
            acts = torch.tanh(a) * torch.sigmoid(b)
            out = rs(acts)
            if i < len(self.in_layers) - 1:
                h = h + out[:, : self.hidden]
                skip = skip + out[:, self.hidden :]
            else:
                skip = skip + out
        return x + self.end(skip)


def make_signals(n, length, gen):
    t = torch.linspace(0, 1, length)
    f = 2 + 10 * torch.rand(n, 1, generator=gen)
    phase = 2 * math.pi * torch.rand(n, 1, generator=gen)
    clean = torch.sin(2 * math.pi * f * t + phase) * torch.exp(-2 * t)
    noisy = clean + 0.2 * torch.randn(n, length, generator=gen)
    return noisy.unsqueeze(1), clean.unsqueeze(1)


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    noisy, clean = make_signals(192, 256, gen)
    model = WN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        perm = torch.randperm(noisy.shape[0], generator=gen)
        for it, s in enumerate(range(0, noisy.shape[0], 32)):
            idx = perm[s : s + 32]
            loss = F.l1_loss(model(noisy[idx]), clean[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"epoch {epoch} it {it} l1 {loss.item():.5f}")


if __name__ == "__main__":
    main()
