"""Planted bug: an encoder and a new decoder trained by two SGD optimizers, the decoder's rate
set far above the encoder's ("it is trained from scratch"): the decoder's updates diverge."""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--lr-encoder", type=float, default=0.02)
parser.add_argument("--lr-decoder", type=float, default=1.2)  # the line to fix
parser.add_argument("--steps", type=int, default=60)
args = parser.parse_args()

torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
decoder = nn.Linear(32, 1)
optimizer_encoder = torch.optim.SGD(encoder.parameters(), lr=args.lr_encoder, momentum=0.9)
optimizer_decoder = torch.optim.SGD(decoder.parameters(), lr=args.lr_decoder, momentum=0.9)
x = torch.randn(256, 8)
y = x[:, :1] * 2.0 - x[:, 1:2] + 0.5 * x[:, 2:3] ** 2
for step in range(args.steps):
    loss = nn.functional.mse_loss(decoder(encoder(x)), y)
    optimizer_encoder.zero_grad()
    optimizer_decoder.zero_grad()
    loss.backward()
    optimizer_encoder.step()
    optimizer_decoder.step()
    print(f"step {step} loss {loss.item():.4g}")
