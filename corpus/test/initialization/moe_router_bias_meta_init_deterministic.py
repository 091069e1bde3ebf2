"""Tiny mixture-of-experts decoder LM, torchtitan-style construction.

The model is declared on the meta device, materialised with to_empty() and then every
module initialises its own parameters through init_weights(). Deterministic mode is on
so that debug runs are bit-for-bit reproducible.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_experts=4, top_k=2,
              hidden_dim=128, seq_len=32, init_std=0.02)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def init_weights(self):
        nn.init.ones_(self.weight)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def init_weights(self, std):
        nn.init.trunc_normal_(self.qkv.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.out.weight, mean=0.0, std=std)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Router(nn.Module):
    def __init__(self, dim, n_experts, top_k):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(dim, n_experts, bias=True)

    def init_weights(self, std):
        nn.init.trunc_normal_(self.gate.weight, mean=0.0, std=std)

    def forward(self, x):
        scores = torch.sigmoid(self.gate(x))
        top_scores, top_idx = scores.topk(self.top_k, dim=-1)
        top_scores = top_scores / top_scores.sum(-1, keepdim=True)
        return top_scores, top_idx


class Experts(nn.Module):
    def __init__(self, dim, hidden_dim, n_experts):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_experts, dim, hidden_dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, hidden_dim, dim))
        self.w3 = nn.Parameter(torch.empty(n_experts, dim, hidden_dim))

    def init_weights(self, std):
        nn.init.trunc_normal_(self.w1, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.w2, mean=0.0, std=std)
        nn.init.trunc_normal_(self.w3, mean=0.0, std=std)

    def forward(self, x, expert):
        return (F.silu(x @ self.w1[expert]) * (x @ self.w3[expert])) @ self.w2[expert]


class MoE(nn.Module):
    def __init__(self, dim, hidden_dim, n_experts, top_k):
        super().__init__()
        self.router = Router(dim, n_experts, top_k)
        self.experts = Experts(dim, hidden_dim, n_experts)
        self.n_experts = n_experts

    def init_weights(self, std):
        self.router.init_weights(std)
        self.experts.init_weights(std)

    def forward(self, x):
        b, t, d = x.shape
        flat = x.reshape(-1, d)
        weights, idx = self.router(flat)
        out = torch.zeros_like(flat)
        for e in range(self.n_experts):
            token_ids, slot = (idx == e).nonzero(as_tuple=True)
            if token_ids.numel() == 0:
                continue
            y = self.experts(flat[token_ids], e)
            out = out.index_add(0, token_ids, y * weights[token_ids, slot].unsqueeze(-1))
        return out.view(b, t, d)


class Block(nn.Module):
    def __init__(self, cfg, layer_id):
        super().__init__()
        self.attn_norm = RMSNorm(cfg["dim"])
        self.attn = Attention(cfg["dim"], cfg["n_heads"])
        self.ffn_norm = RMSNorm(cfg["dim"])
        self.moe = MoE(cfg["dim"], cfg["hidden_dim"], cfg["n_experts"], cfg["top_k"])
        self.depth_std = cfg["init_std"] / math.sqrt(2 * (layer_id + 1))

    def init_weights(self):
        self.attn_norm.init_weights()
        self.ffn_norm.init_weights()
        self.attn.init_weights(self.depth_std)
        self.moe.init_weights(self.depth_std)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.moe(self.ffn_norm(x))


class MoETransformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_embeddings = nn.Embedding(cfg["vocab_size"], cfg["dim"])
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg["n_layers"]))
        self.norm = RMSNorm(cfg["dim"])
        self.output = nn.Linear(cfg["dim"], cfg["vocab_size"], bias=False)

    def init_weights(self):
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers:
            layer.init_weights()
        self.norm.init_weights()
        nn.init.trunc_normal_(self.output.weight, mean=0.0, std=CONFIG["dim"] ** -0.5)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def synthetic_batches(n_batches, batch_size, seq_len, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_batches):
        start = torch.randint(0, vocab, (batch_size, 1), generator=g)
        step = torch.randint(1, 4, (batch_size, 1), generator=g)
        seq = (start + step * torch.arange(seq_len + 1)) % vocab
        yield seq[:, :-1], seq[:, 1:]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    with torch.device("meta"):
        model = MoETransformer(CONFIG)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights()
    model.train()

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    batches = synthetic_batches(args.steps, args.batch_size, CONFIG["seq_len"],
                                CONFIG["vocab_size"], args.seed)
    for step, (inputs, labels) in enumerate(batches, start=1):
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step == 1 or step % 5 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
