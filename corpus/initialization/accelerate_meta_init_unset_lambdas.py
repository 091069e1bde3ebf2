"""Small nanochat-style GPT pretraining loop with Hugging Face Accelerate.

The model is built on the meta device (accelerate.init_empty_weights) so that no
memory is spent on a throw-away random init, then materialised with to_empty()
and initialised by the model's own init_weights().  Besides the usual matrices the
model has a few learnable scalars: per-layer residual / x0 mixing lambdas, a
"smear" gate that mixes the previous token's embedding into the current one, and a
"backout" lambda that subtracts part of the mid-network residual before the head.
Training data is a synthetic token stream from a random bigram model.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from accelerate import Accelerator, init_empty_weights
from accelerate.utils import set_seed


class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.fc_out = nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(F.rms_norm(x, (C,))).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        x = x + self.fc_out(F.relu(self.fc(F.rms_norm(x, (C,)))).square())
        return x


class GPT(nn.Module):
    def __init__(self, vocab_size, seq_len, n_layer, d_model, n_head):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_head) for _ in range(n_layer)])
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.resid_lambdas = nn.Parameter(torch.ones(n_layer))
        self.x0_lambdas = nn.Parameter(torch.zeros(n_layer))
        self.smear_gate = nn.Linear(16, 1, bias=False)
        self.smear_lambda = nn.Parameter(torch.zeros(1))
        self.backout_lambda = nn.Parameter(0.2 * torch.ones(1))

    @torch.no_grad()
    def init_weights(self):
        n_layer = len(self.blocks)
        d = self.wte.weight.shape[1]
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.wpe.weight, std=0.02)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        bound = 3 ** 0.5 * d ** -0.5
        for block in self.blocks:
            for lin in (block.qkv, block.fc):
                nn.init.uniform_(lin.weight, -bound, bound)
            nn.init.zeros_(block.proj.weight)
            nn.init.zeros_(block.fc_out.weight)
        self.resid_lambdas.fill_(1.0)
        for i in range(n_layer):
            self.x0_lambdas[i] = 0.2 - 0.15 * i / max(n_layer - 1, 1)
        nn.init.uniform_(self.smear_gate.weight, 0.0, 0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        gate = self.smear_lambda * torch.sigmoid(self.smear_gate(x[:, 1:, :16]))
        x = torch.cat([x[:, :1], x[:, 1:] + gate * x[:, :-1]], dim=1)
        x0 = x
        mid = len(self.blocks) // 2
        x_backout = None
        for i, block in enumerate(self.blocks):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            x = block(x)
            if i == mid:
                x_backout = x
        x = x - self.backout_lambda * x_backout
        logits = self.lm_head(F.rms_norm(x, (x.size(-1),)))
        logits = 15 * torch.tanh(logits / 15)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def bigram_stream(vocab_size, n_tokens, seed):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(vocab_size, vocab_size, generator=g) * 2.5, dim=-1)
    toks = torch.empty(n_tokens, dtype=torch.long)
    toks[0] = 0
    nxt = torch.multinomial(probs, n_tokens, replacement=True, generator=g)
    for i in range(1, n_tokens):
        toks[i] = nxt[toks[i - 1], i]
    return toks


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--d_model", type=int, default=64)
    parser.add_argument("--seq_len", type=int, default=32)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--vocab_size", type=int, default=96)
    parser.add_argument("--num_iterations", type=int, default=40)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    set_seed(args.seed, deterministic=True)

    with init_empty_weights():
        model = GPT(args.vocab_size, args.seq_len, args.depth, args.d_model, n_head=4)
    model.to_empty(device=accelerator.device)
    model.init_weights()

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.8, 0.95), weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda it: min(1.0, (it + 1) / 10) * max(0.1, 1 - it / args.num_iterations)
    )
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)

    stream = bigram_stream(args.vocab_size, 40_000, args.seed)
    n_windows = len(stream) - args.seq_len - 1
    for it in range(args.num_iterations):
        starts = torch.randint(0, n_windows, (args.batch_size,))
        x = torch.stack([stream[s: s + args.seq_len] for s in starts]).to(accelerator.device)
        y = torch.stack([stream[s + 1: s + 1 + args.seq_len] for s in starts]).to(accelerator.device)
        model.train()
        loss = model(x, y)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if it % 5 == 0 or it == args.num_iterations - 1:
            accelerator.print(f"iter {it:3d} | loss {loss.item():.4f} | lr {scheduler.get_last_lr()[0]:.2e} | "
                              f"bits/token {loss.item() / math.log(2):.3f}")


if __name__ == "__main__":
    main()
