"""Tiny character-level GPT trained speedrun-style: NorMuon for the hidden matrices,
AdamW for embeddings / head.  Residual output projections are zero-initialised
(modded-nanogpt trick) so every block starts as the identity.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

TEXT = (
    "the quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun. "
    "a stitch in time saves nine and every cloud has a silver lining after the storm. "
) * 40


# ----------------------------------------------------------------------------- optimizer
def zeropower_via_newtonschulz5(G, steps=5):
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.float()
    if G.size(0) > G.size(1):
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(0) > G.size(1):
        X = X.T
    return X


class NorMuon(torch.optim.Optimizer):
    """Muon with neuron-wise second-moment normalisation of the orthogonalised update."""

    def __init__(self, params, lr=0.02, momentum=0.95, beta2=0.95, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, beta2=beta2, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                    state["v"] = torch.zeros(p.shape[0], 1)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - group["momentum"])
                g = p.grad.lerp(buf, group["momentum"])  # nesterov
                U = zeropower_via_newtonschulz5(g)
                # neuron-wise normalisation, then restore the Frobenius norm
                norm_U = U.norm()
                state["v"].lerp_((U * U).mean(dim=1, keepdim=True), 1 - group["beta2"])
                U = U / (state["v"].sqrt() + 1e-8)
                U = U * (norm_U / U.norm())
                scale = max(1.0, p.shape[0] / p.shape[1]) ** 0.5
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(U.to(p.dtype), alpha=-group["lr"] * scale)


# ----------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.attn_proj = nn.Linear(d, d, bias=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.mlp_proj = nn.Linear(4 * d, d, bias=False)
        self.attn_proj.weight.detach().zero_()
        self.mlp_proj.weight.detach().zero_()

    def forward(self, x):
        B, T, D = x.shape
        h = F.rms_norm(x, (D,))
        q, k, v = self.qkv(h).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, D))
        h = F.rms_norm(x, (D,))
        return x + self.mlp_proj(F.relu(self.fc(h)).square())


class GPT(nn.Module):
    def __init__(self, vocab, d=64, n_layer=2, n_head=4, block=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, n_head) for _ in range(n_layer))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.head(F.rms_norm(x, (x.shape[-1],)))


def main():
    torch.manual_seed(0)
    chars = sorted(set(TEXT))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in TEXT])
    block, bs = 32, 16

    model = GPT(len(chars), block=block)
    hidden = [p for n, p in model.blocks.named_parameters() if p.ndim == 2]
    other = [model.tok.weight, model.pos.weight, model.head.weight]
    opt_muon = NorMuon(hidden, lr=0.02)
    opt_adam = torch.optim.AdamW(other, lr=3e-3, betas=(0.9, 0.95), weight_decay=0.0)

    for step in range(60):
        ix = torch.randint(len(data) - block - 1, (bs,))
        x = torch.stack([data[i : i + block] for i in ix])
        y = torch.stack([data[i + 1 : i + block + 1] for i in ix])
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
        opt_muon.zero_grad()
        opt_adam.zero_grad()
        loss.backward()
        opt_muon.step()
        opt_adam.step()
        if step % 5 == 0:
            print(f"step {step:3d} train loss {loss.item():.4f} ppl {math.exp(min(loss.item(), 20)):.2f}")


if __name__ == "__main__":
    main()
