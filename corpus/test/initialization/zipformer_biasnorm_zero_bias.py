#!/usr/bin/env python3
"""Zipformer-style CTC recipe whose BiasNorm bias starts at exactly zero.

Report: https://github.com/k2-fsa/icefall/pull/1630 ("Initialize BiasNorm bias with
small random values", merged). BiasNorm, the LayerNorm replacement of Zipformer,
computes ``scales = mean((x - bias) ** 2) ** -0.5 * exp(log_scale)`` and returns
``x * scales``. Its bias was created with ``torch.zeros(num_channels)``, so an
all-zero input vector gives mean(0) ** -0.5 = inf and 0 * inf = nan.

This recipe is a small pre-norm Zipformer-like encoder trained with CTC on
synthetic fbank batches of variable length. As in many recipes, padded frames of
the subsampled embedding are zeroed with ``masked_fill`` before the encoder. The
first BiasNorm therefore sees all-zero vectors on every padded frame of the very
first batch while its bias is still exactly zero: those rows become nan, the nan
values leak through the attention (0 attention weight * nan value = nan) and the
loss is nan at batch 0; the nan gradients then poison every parameter.

Fix (maintainers, icefall PR #1630): initialise the bias with small random values,
``self.bias = nn.Parameter(torch.empty(num_channels).normal_(mean=0, std=1e-4))``.
"""
import argparse
import logging
import math
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


class BiasNorm(nn.Module):
    """Simpler replacement for LayerNorm: a learnable bias used only for the scale."""

    def __init__(self, num_channels: int, channel_dim: int = -1, log_scale: float = 1.0,
                 log_scale_min: float = -1.5, log_scale_max: float = 1.5) -> None:
        super().__init__()
        self.num_channels = num_channels
        self.channel_dim = channel_dim
        self.log_scale = nn.Parameter(torch.tensor(log_scale))
        self.bias = nn.Parameter(torch.zeros(num_channels))
        self.log_scale_min = log_scale_min
        self.log_scale_max = log_scale_max

    def forward(self, x: Tensor) -> Tensor:
        assert x.shape[self.channel_dim] == self.num_channels
        log_scale = self.log_scale.clamp(min=self.log_scale_min, max=self.log_scale_max)
        scales = (torch.mean((x - self.bias) ** 2, dim=self.channel_dim, keepdim=True) ** -0.5) * log_scale.exp()
        return x * scales


class Conv2dSubsampling(nn.Module):
    """(N, T, idim) -> (N, T', odim) with T' = ((T - 1) // 2 - 1) // 2."""

    def __init__(self, in_channels: int, out_channels: int, layer_channels: int = 8) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, layer_channels, 3, stride=2), nn.ReLU(),
            nn.Conv2d(layer_channels, layer_channels, 3, stride=2), nn.ReLU(),
        )
        out_width = ((in_channels - 1) // 2 - 1) // 2
        self.out = nn.Linear(layer_channels * out_width, out_channels)

    def forward(self, x: Tensor, x_lens: Tensor):
        x = self.conv(x.unsqueeze(1))
        b, c, t, f = x.shape
        x = self.out(x.transpose(1, 2).reshape(b, t, c * f))
        x_lens = ((x_lens - 1) // 2 - 1) // 2
        return x, x_lens


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, nhead: int, ff_dim: int, dropout: float) -> None:
        super().__init__()
        self.norm_attn = BiasNorm(d_model)
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.norm_ff = BiasNorm(d_model)
        self.feed_forward = nn.Sequential(nn.Linear(d_model, ff_dim), nn.SiLU(), nn.Dropout(dropout),
                                          nn.Linear(ff_dim, d_model))

    def forward(self, src: Tensor, src_key_padding_mask: Tensor) -> Tensor:
        x = self.norm_attn(src)
        src = src + self.self_attn(x, x, x, key_padding_mask=src_key_padding_mask, need_weights=False)[0]
        src = src + self.feed_forward(self.norm_ff(src))
        return src


class CtcModel(nn.Module):
    def __init__(self, params: dict) -> None:
        super().__init__()
        self.encoder_embed = Conv2dSubsampling(params["feature_dim"], params["encoder_dim"])
        self.encoder = nn.ModuleList([
            EncoderLayer(params["encoder_dim"], params["num_heads"], params["feedforward_dim"], params["dropout"])
            for _ in range(params["num_encoder_layers"])
        ])
        self.final_norm = BiasNorm(params["encoder_dim"])
        self.ctc_output = nn.Linear(params["encoder_dim"], params["vocab_size"])

    def forward(self, x: Tensor, x_lens: Tensor):
        x, x_lens = self.encoder_embed(x, x_lens)
        src_key_padding_mask = torch.arange(x.size(1))[None, :] >= x_lens[:, None]
        x = x.masked_fill(src_key_padding_mask.unsqueeze(-1), 0.0)
        for layer in self.encoder:
            x = layer(x, src_key_padding_mask)
        logits = self.ctc_output(self.final_norm(x))
        return logits.log_softmax(dim=-1), x_lens


def get_params() -> dict:
    return dict(feature_dim=40, encoder_dim=64, num_heads=4, feedforward_dim=128, num_encoder_layers=2,
                dropout=0.0, vocab_size=16, blank_id=0, batch_size=6, num_batches=25, log_interval=1,
                base_lr=1e-3)


def synthetic_batches(params: dict, seed: int):
    """Fbank-like features of variable length, padded with zeros (as the collate fn does)."""
    rng = np.random.RandomState(seed)
    protos = rng.normal(0, 1, size=(params["vocab_size"], params["feature_dim"])).astype(np.float32)
    for _ in range(params["num_batches"]):
        feats, lens, targets, target_lens = [], [], [], []
        for _ in range(params["batch_size"]):
            n_tok = rng.randint(3, 7)
            toks = rng.randint(1, params["vocab_size"], size=n_tok)
            frames = np.concatenate([np.repeat(protos[t][None], rng.randint(8, 13), 0) for t in toks])
            frames = frames + 0.3 * rng.normal(size=frames.shape).astype(np.float32)
            feats.append(frames); lens.append(len(frames)); targets.append(toks); target_lens.append(n_tok)
        T = max(lens)
        x = np.zeros((len(feats), T, params["feature_dim"]), dtype=np.float32)
        for i, f in enumerate(feats):
            x[i, :len(f)] = f
        yield (torch.from_numpy(x), torch.tensor(lens), torch.from_numpy(np.concatenate(targets)),
               torch.tensor(target_lens))


def compute_loss(model: nn.Module, batch, params: dict) -> Tensor:
    x, x_lens, targets, target_lens = batch
    log_probs, out_lens = model(x, x_lens)
    loss = F.ctc_loss(log_probs.transpose(0, 1), targets, out_lens, target_lens,
                      blank=params["blank_id"], reduction="sum", zero_infinity=False)
    return loss / x.size(0)


def train_one_epoch(params: dict, model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    model.train()
    tot_loss = 0.0
    for batch_idx, batch in enumerate(synthetic_batches(params, seed)):
        loss = compute_loss(model, batch, params)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        tot_loss = 0.9 * tot_loss + 0.1 * loss.item() if batch_idx else loss.item()
        if batch_idx % params["log_interval"] == 0:
            logging.info(f"Epoch 1, batch {batch_idx}, loss[{loss.item():.4f}], tot_loss[{tot_loss:.4f}], "
                         f"batch size: {batch[0].size(0)}, lr: {optimizer.param_groups[0]['lr']:.2e}")
        if math.isnan(loss.item()) and batch_idx >= 2:
            logging.info("loss is nan, stopping")
            break


def main():
    parser = argparse.ArgumentParser(description="zipformer-style CTC training (mini)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--num-batches", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(stream=sys.stdout, level=logging.INFO,
                        format="%(levelname)s [train.py] %(message)s")
    params = get_params()
    if args.num_batches:
        params["num_batches"] = args.num_batches
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    model = CtcModel(params)
    num_param = sum(p.numel() for p in model.parameters())
    logging.info(f"Number of model parameters: {num_param}")
    optimizer = torch.optim.Adam(model.parameters(), lr=params["base_lr"])
    train_one_epoch(params, model, optimizer, args.seed)
    logging.info("Done!")


if __name__ == "__main__":
    main()
