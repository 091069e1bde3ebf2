"""Two-tower CTR / CVR model trained with a vendored BigVision-style Adafactor.

The conversion (CVR) tower is only supervised on clicked impressions, so a
mini-batch without a single click gives every CVR-tower weight an exactly-zero
gradient.  The vendored optimizer clips the Adafactor update by its RMS with

    denom = (update.norm(2) / (numel ** 0.5 / clipping_threshold)).clamp_(max=1.0)
    update.div_(denom)

i.e. it divides by min(1, rms * threshold) instead of max(1, rms / threshold).
For a zero update that is 0 / 0 = NaN, the NaN goes into the momentum buffer
and the CVR tower weights, and every loss after that is nan.

Reproduces: https://github.com/huggingface/pytorch-image-models/pull/2790
("Fix RMS clipping direction in AdafactorBigVision").
Fix (as merged): divide by max(1, rms / clipping_threshold):
    update_rms = update.norm(2) / (update.numel() ** 0.5)
    update.div_((update_rms / clipping_threshold).clamp_(min=1.0))
"""
import argparse
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import Optimizer
from torch.utils.data import DataLoader, Dataset


def _factored_dims(shape, factored, min_dim_size_to_factor):
    if not factored or len(shape) < 2:
        return None
    sorted_dims = sorted(((x, i) for i, x in enumerate(shape)))
    if shape[sorted_dims[-2][1]] < min_dim_size_to_factor:
        return None
    return int(sorted_dims[-2][1]), int(sorted_dims[-1][1])


class AdafactorBV(Optimizer):
    """Adafactor variant from big_vision (copied from timm.optim.adafactor_bv)."""

    def __init__(self, params, lr=1.0, min_dim_size_to_factor=32, decay_rate=0.8,
                 beta2_cap=0.999, momentum: Optional[float] = 0.9, eps=1e-30,
                 weight_decay=0.0, clipping_threshold: Optional[float] = None):
        defaults = dict(lr=lr, min_dim_size_to_factor=min_dim_size_to_factor,
                        decay_rate=decay_rate, beta2_cap=beta2_cap, momentum=momentum,
                        eps=eps, weight_decay=weight_decay,
                        clipping_threshold=clipping_threshold)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    dims = _factored_dims(grad.shape, True, group["min_dim_size_to_factor"])
                    if dims is not None:
                        d1, d0 = dims
                        row_shape = list(grad.shape); row_shape[d0] = 1
                        col_shape = list(grad.shape); col_shape[d1] = 1
                        state["exp_avg_sq_r"] = grad.new_zeros(row_shape)
                        state["exp_avg_sq_c"] = grad.new_zeros(col_shape)
                    else:
                        state["exp_avg_sq"] = torch.zeros_like(grad)
                    if group["momentum"] is not None:
                        state["exp_avg"] = torch.zeros_like(grad)

                state["step"] += 1
                beta2_t = min(group["beta2_cap"], 1.0 - state["step"] ** (-group["decay_rate"]))
                grad_sqr = torch.square(grad) + group["eps"]
                if "exp_avg_sq" not in state:
                    d1, d0 = _factored_dims(grad.shape, True, group["min_dim_size_to_factor"])
                    state["exp_avg_sq_r"].lerp_(grad_sqr.mean(dim=d0, keepdim=True), 1 - beta2_t)
                    state["exp_avg_sq_c"].lerp_(grad_sqr.mean(dim=d1, keepdim=True), 1 - beta2_t)
                    reduced_d1 = d1 - 1 if d1 > d0 else d1
                    row_col_mean = state["exp_avg_sq_r"].mean(dim=reduced_d1, keepdim=True)
                    row_factor = (state["exp_avg_sq_r"] / row_col_mean).rsqrt()
                    col_factor = state["exp_avg_sq_c"].rsqrt()
                    update = grad * row_factor * col_factor
                else:
                    state["exp_avg_sq"].lerp_(grad_sqr, 1 - beta2_t)
                    update = grad * state["exp_avg_sq"].rsqrt()

                # Clip by RMS value
                if group["clipping_threshold"] is not None:
                    denom = (update.norm(2) / ((update.numel() ** 0.5) / group["clipping_threshold"])).clamp_(max=1.0)
                    update.div_(denom)

                if group["momentum"] is not None:
                    state["exp_avg"].lerp_(update, 1 - group["momentum"])
                    update = state["exp_avg"].clone()

                update.mul_(group["lr"])
                if group["weight_decay"] != 0:
                    p.mul_(1.0 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-1.0)
        return None


class ImpressionLog(Dataset):
    """Synthetic ad impressions: user/ad ids + dense context, click and conversion labels."""

    def __init__(self, n, n_users=500, n_ads=200, seed=0):
        rng = np.random.RandomState(seed)
        self.user = rng.randint(0, n_users, size=n)
        self.ad = rng.randint(0, n_ads, size=n)
        self.dense = rng.randn(n, 8).astype(np.float32)
        user_aff = rng.randn(n_users) * 0.8
        ad_q = rng.randn(n_ads) * 0.8
        ctr_logit = -3.3 + user_aff[self.user] + ad_q[self.ad] + 0.5 * self.dense[:, 0]
        self.click = (rng.rand(n) < 1 / (1 + np.exp(-ctr_logit))).astype(np.float32)
        cvr_logit = -0.5 + 0.7 * ad_q[self.ad] + 0.8 * self.dense[:, 1]
        self.conv = (self.click * (rng.rand(n) < 1 / (1 + np.exp(-cvr_logit)))).astype(np.float32)

    def __len__(self):
        return len(self.click)

    def __getitem__(self, i):
        return (torch.tensor(self.user[i]), torch.tensor(self.ad[i]),
                torch.from_numpy(self.dense[i]), torch.tensor(self.click[i]),
                torch.tensor(self.conv[i]))


class CtrCvrModel(nn.Module):
    def __init__(self, n_users=500, n_ads=200, emb=16, hidden=64):
        super().__init__()
        self.user_emb = nn.Embedding(n_users, emb)
        self.ad_emb = nn.Embedding(n_ads, emb)
        self.bottom = nn.Sequential(nn.Linear(2 * emb + 8, hidden), nn.ReLU())
        self.ctr_tower = nn.Sequential(nn.Linear(hidden, 32), nn.ReLU(), nn.Linear(32, 1))
        self.cvr_tower = nn.Sequential(nn.Linear(hidden, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, user, ad, dense):
        h = self.bottom(torch.cat([self.user_emb(user), self.ad_emb(ad), dense], dim=1))
        return self.ctr_tower(h).squeeze(1), self.cvr_tower(h).squeeze(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    np.random.seed(0)
    train_set = ImpressionLog(6000, seed=1)
    print(f"train impressions {len(train_set)}, ctr {train_set.click.mean():.3f}, "
          f"conversions {int(train_set.conv.sum())}")
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(0))

    model = CtrCvrModel()
    optimizer = AdafactorBV(model.parameters(), lr=args.lr, clipping_threshold=1.0)

    step = 0
    for epoch in range(args.epochs):
        for user, ad, dense, click, conv in loader:
            ctr_logit, cvr_logit = model(user, ad, dense)
            ctr_loss = F.binary_cross_entropy_with_logits(ctr_logit, click)
            # CVR is only observed on clicked impressions
            cvr_bce = F.binary_cross_entropy_with_logits(cvr_logit, conv, reduction="none")
            cvr_loss = (cvr_bce * click).sum() / click.sum().clamp(min=1.0)
            loss = ctr_loss + cvr_loss

            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            if step % args.log_every == 0:
                print(f"epoch {epoch} step {step:4d} loss {loss.item():.4f} "
                      f"ctr {ctr_loss.item():.4f} cvr {cvr_loss.item():.4f} clicks {int(click.sum())}")
            step += 1


if __name__ == "__main__":
    main()
