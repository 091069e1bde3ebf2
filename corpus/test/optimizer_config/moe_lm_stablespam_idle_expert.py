"""Tiny mixture-of-experts language model trained with StableSPAM (pytorch_optimizer 3.7 vendored).

StableSPAM rescales every gradient tensor by its own norm before the Adam update:
``grad.div_(grad_norm).mul_(c_norm_t)``.  There is no guard for ``grad_norm == 0``.  The MoE
layer is computed densely (every expert runs on every token and is multiplied by its top-1 gate,
which is exactly 0 for unselected experts), so an expert that receives no token in a batch gets
a gradient tensor of exact zeros.  Noisy gating keeps the routing balanced at first; once the
router has specialised, a batch arrives in which one expert is idle (step 135 here), 0 / 0 = nan
is written into that expert's Adam moments and weights, and because the dense combine multiplies
the nan expert output by a 0 gate (0 * nan = nan) the loss is nan from the next step on.

Reproduces: https://github.com/kozistr/pytorch_optimizer/pull/431 ("Grad_norm maybe zero. There
is no need to update param for such situation."; merged into StableSPAM).

Fix: in StableSPAM.step skip the parameter when its gradient norm is zero
(``if grad_norm == 0: continue`` right after computing it); the same run then trains to the end.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import Optimizer


# ------------------------------------------------------------------ optimizer (vendored)
class StableSPAM(Optimizer):
    r"""How to Train in 4-Bit More Stably than 16-Bit Adam."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), gamma1=0.7, gamma2=0.9, theta=0.999,
                 weight_decay=0.0, update_proj_gap=1000, eps=1e-8):
        self.gamma1 = betas[0] if gamma1 == -1.0 else gamma1
        self.gamma2 = gamma2
        self.theta = theta
        self.update_proj_gap = update_proj_gap
        self.total_step = 0
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay, eps=eps))

    def init_group(self, group):
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "exp_avg" not in state:
                state["exp_avg"] = torch.zeros_like(p.grad)
                state["exp_avg_sq"] = torch.zeros_like(p.grad)
                state["m_norm_t"] = torch.zeros(1, dtype=p.grad.dtype)
                state["v_norm_t"] = torch.zeros(1, dtype=p.grad.dtype)
                state["m_max_t"] = torch.zeros(1, dtype=p.grad.dtype)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        self.total_step += 1
        scale = 1.0

        for group in self.param_groups:
            if "step" not in group:
                self.init_group(group)
                group["step"] = 1
            else:
                group["step"] += 1

            beta1, beta2 = group["betas"]
            beta1 *= scale
            bias_correction1 = 1.0 - beta1 ** group["step"]
            bias_correction2_sq = math.sqrt(1.0 - beta2 ** group["step"])
            step_size = group["lr"] / bias_correction1
            theta_t = 1.0 - self.theta ** group["step"]

            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]

                p.mul_(1.0 - group["weight_decay"] * group["lr"])

                max_grad = torch.max(grad.abs())
                exp_avg, exp_avg_sq, m_max_t = state["exp_avg"], state["exp_avg_sq"], state["m_max_t"]
                m_max_t.lerp_(max_grad, weight=1.0 - self.theta)
                m_max_hat = m_max_t / theta_t

                mask = grad.abs() > m_max_hat
                if mask.sum() > 0:
                    grad[mask].div_(max_grad).mul_(m_max_hat)

                grad_norm = torch.norm(grad)

                m_norm_t, v_norm_t = state["m_norm_t"], state["v_norm_t"]
                m_norm_t.lerp_(grad_norm, weight=1.0 - self.gamma1 * scale)
                v_norm_t.lerp_(grad_norm.pow(2), weight=1.0 - self.gamma2)
                m_norm_hat = m_norm_t / (1.0 - (self.gamma1 * scale) ** group["step"])
                v_norm_hat = v_norm_t / (1.0 - self.gamma2 ** group["step"])
                c_norm_t = m_norm_hat.div_(v_norm_hat.sqrt_().add_(group["eps"]))

                grad.div_(grad_norm).mul_(c_norm_t)

                if self.update_proj_gap > 0 and self.total_step % self.update_proj_gap == 0:
                    state["exp_avg"] = torch.zeros_like(grad)
                    state["exp_avg_sq"] = torch.zeros_like(grad)
                    group["step"] = 1

                exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                de_nom = exp_avg_sq.sqrt().div_(bias_correction2_sq).add_(group["eps"])
                p.addcdiv_(exp_avg, de_nom, value=-step_size)

        return loss


# ------------------------------------------------------------------ model
class Expert(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MoEFeedForward(nn.Module):
    """Top-1 MoE with noisy gating (router logits + N(0, noise_std) while training)."""

    def __init__(self, d, hidden, n_experts, noise_std=1.0):
        super().__init__()
        self.router = nn.Linear(d, n_experts)
        self.experts = nn.ModuleList([Expert(d, hidden) for _ in range(n_experts)])
        self.noise_std = noise_std

    def forward(self, x):
        logits = self.router(x)
        if self.training and self.noise_std > 0:
            logits = logits + torch.randn_like(logits) * self.noise_std
        probs = logits.softmax(dim=-1)                               # (N, E)
        top_p, top_i = probs.max(dim=-1)
        gates = torch.zeros_like(probs).scatter(-1, top_i[:, None], top_p[:, None])
        expert_out = torch.stack([e(x) for e in self.experts], dim=1)   # (N, E, d)
        y = (gates.unsqueeze(-1) * expert_out).sum(dim=1)
        return y, top_i


class TinyMoELM(nn.Module):
    def __init__(self, vocab, d=32, hidden=64, n_experts=8, context=3):
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab, d)
        self.mix = nn.Linear(context * d, d)
        self.norm1 = nn.LayerNorm(d)
        self.moe = MoEFeedForward(d, hidden, n_experts)
        self.norm2 = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, ctx):                       # ctx: (N, context) token ids
        h = self.mix(self.tok(ctx).flatten(1))
        y, routes = self.moe(self.norm1(h))
        h = h + y
        return self.head(self.norm2(h)), routes


# ------------------------------------------------------------------ data
def make_corpus(vocab, n_tokens, n_regimes, gen):
    """Token stream from a few sparse Markov chains ("topics") that switch every ~50 tokens."""
    trans = []
    for _ in range(n_regimes):
        logits = torch.randn(vocab, vocab, generator=gen) * 3.0
        trans.append(logits.softmax(-1))
    stream = torch.empty(n_tokens, dtype=torch.long)
    tok, regime = 0, 0
    for i in range(n_tokens):
        if i % 50 == 0:
            regime = int(torch.randint(n_regimes, (1,), generator=gen))
        tok = int(torch.multinomial(trans[regime][tok], 1, generator=gen))
        stream[i] = tok
    return stream


def get_batch(stream, context, batch, gen):
    idx = torch.randint(context, len(stream), (batch,), generator=gen)
    ctx = torch.stack([stream[i - context:i] for i in idx.tolist()])
    return ctx, stream[idx]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=48)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    stream = make_corpus(args.vocab, 30000, n_regimes=4, gen=gen)

    model = TinyMoELM(args.vocab, n_experts=args.experts)
    optimizer = StableSPAM(model.parameters(), lr=args.lr, weight_decay=0.01)

    for step in range(args.steps):
        ctx, target = get_batch(stream, model.context, args.batch, gen)
        logits, routes = model(ctx)
        loss = F.cross_entropy(logits, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            load = torch.bincount(routes, minlength=args.experts).tolist()
            print(f"step {step:4d}  loss {loss.item():.4f}  tokens/expert {load}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
