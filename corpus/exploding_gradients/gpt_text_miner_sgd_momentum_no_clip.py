"""Text miner: trains a small GPT-style causal language model on a stream of
synthetic token sequences and reports the next-token loss every few steps."""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def get_config():
    parser = argparse.ArgumentParser(description="GPT text miner")
    parser.add_argument("--miner.n_epochs", dest="n_epochs", type=int, default=7)
    parser.add_argument("--miner.epoch_length", dest="epoch_length", type=int, default=40)
    parser.add_argument("--miner.batch_size_train", dest="batch_size", type=int, default=16)
    parser.add_argument("--miner.learning_rate", dest="learning_rate", type=float, default=0.5)
    parser.add_argument("--miner.momentum", dest="momentum", type=float, default=0.98)
    parser.add_argument("--nucleus.n_embd", dest="n_embd", type=int, default=64)
    parser.add_argument("--nucleus.n_layer", dest="n_layer", type=int, default=2)
    parser.add_argument("--nucleus.n_head", dest="n_head", type=int, default=4)
    parser.add_argument("--nucleus.vocab_size", dest="vocab_size", type=int, default=256)
    parser.add_argument("--nucleus.block_size", dest="block_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("mask", mask)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class GPTNucleus(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Parameter(torch.zeros(1, config.block_size, config.n_embd))
        self.blocks = nn.Sequential(*[Block(config.n_embd, config.n_head, config.block_size)
                                      for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx):
        x = self.tok_emb(idx) + self.pos_emb[:, :idx.size(1)]
        x = self.blocks(x)
        return self.head(self.ln_f(x))


class TextStream:
    """Endless stream of token sequences drawn from a random bigram source."""

    def __init__(self, vocab_size, block_size, batch_size, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.batch_size = batch_size
        logits = torch.randn(vocab_size, vocab_size, generator=self.g) * 3.0
        self.transitions = F.softmax(logits, dim=-1)

        self.corpus = self._sample_corpus(n_chains=256, length=400)

    def _sample_corpus(self, n_chains, length):
        seq = torch.empty(n_chains, length, dtype=torch.long)
        seq[:, 0] = torch.randint(0, self.vocab_size, (n_chains,), generator=self.g)
        for t in range(1, length):
            seq[:, t] = torch.multinomial(self.transitions[seq[:, t - 1]], 1, generator=self.g).squeeze(1)
        return seq.view(-1)

    def next_batch(self):
        starts = torch.randint(0, self.corpus.numel() - self.block_size - 1, (self.batch_size,), generator=self.g)
        chunk = torch.stack([self.corpus[s:s + self.block_size + 1] for s in starts.tolist()])
        return chunk[:, :-1], chunk[:, 1:]


class Miner:
    def __init__(self, config):
        self.config = config
        self.model = GPTNucleus(config)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.learning_rate,
                                         momentum=config.momentum)
        self.stream = TextStream(config.vocab_size, config.block_size, config.batch_size, config.seed)
        self.global_step = 0

    def train_step(self):
        inputs, targets = self.stream.next_batch()
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.global_step += 1
        return loss.item()

    def run(self):
        self.model.train()
        for epoch in range(self.config.n_epochs):
            total = 0.0
            for it in range(self.config.epoch_length):
                loss = self.train_step()
                total += loss
                if it % 5 == 0:
                    print(f"epoch {epoch} step {self.global_step} loss {loss:.4f}")
            print(f"epoch {epoch} done, mean loss {total / self.config.epoch_length:.4f}")


def main():
    config = get_config()
    torch.manual_seed(config.seed)
    miner = Miner(config)
    miner.run()


if __name__ == "__main__":
    main()
