"""BiLSTM-CRF named-entity tagger trained on synthetic BIO-tagged sentences.

Embedding -> bidirectional LSTM -> Linear emission scores -> linear-chain CRF
(a small hand-rolled CRF layer in the style of the ``torchcrf`` package).
The negative CRF log-likelihood is minimised with Adam.
"""
import argparse
import random

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
PAD = 0


class CRF(nn.Module):
    """Linear-chain conditional random field (inputs are seq-first)."""

    def __init__(self, num_tags):
        super().__init__()
        self.num_tags = num_tags
        self.start_transitions = nn.Parameter(torch.Tensor(num_tags))
        self.end_transitions = nn.Parameter(torch.Tensor(num_tags))
        self.transitions = nn.Parameter(torch.Tensor(num_tags, num_tags))

    def forward(self, emissions, tags, mask):
        numerator = self._joint_llh(emissions, tags, mask)
        denominator = self._log_partition(emissions, mask)
        return torch.sum(numerator - denominator)

    def _joint_llh(self, emissions, tags, mask):
        seq_len, batch = tags.shape
        mask = mask.float()
        llh = self.start_transitions[tags[0]]
        for i in range(seq_len - 1):
            cur, nxt = tags[i], tags[i + 1]
            llh = llh + emissions[i].gather(1, cur.unsqueeze(1)).squeeze(1) * mask[i]
            llh = llh + self.transitions[cur, nxt] * mask[i + 1]
        last_idx = mask.long().sum(0) - 1
        last_tags = tags.gather(0, last_idx.unsqueeze(0)).squeeze(0)
        llh = llh + self.end_transitions[last_tags]
        llh = llh + emissions[-1].gather(1, last_tags.unsqueeze(1)).squeeze(1) * mask[-1]
        return llh

    def _log_partition(self, emissions, mask):
        seq_len = emissions.size(0)
        log_prob = self.start_transitions.unsqueeze(0) + emissions[0]
        for i in range(1, seq_len):
            broadcast = log_prob.unsqueeze(2) + self.transitions.unsqueeze(0) + emissions[i].unsqueeze(1)
            nxt = torch.logsumexp(broadcast, dim=1)
            m = mask[i].unsqueeze(1)
            log_prob = torch.where(m, nxt, log_prob)
        return torch.logsumexp(log_prob + self.end_transitions.unsqueeze(0), dim=1)


class BiLSTMCRF(nn.Module):
    def __init__(self, vocab_size, num_tags, emb_dim=32, hidden=48):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, emb_dim, padding_idx=PAD)
        self.lstm = nn.LSTM(emb_dim, hidden // 2, bidirectional=True)
        self.hidden2tag = nn.Linear(hidden, num_tags)
        self.crf = CRF(num_tags)

    def emissions(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.hidden2tag(out)

    def neg_log_likelihood(self, tokens, tags, mask):
        return -self.crf(self.emissions(tokens), tags, mask)


class ToyNERDataset(Dataset):
    """Sentences of random word ids; ids 2..21 are person names, 22..41 places."""

    def __init__(self, n, vocab_size=200, seed=0):
        rng = random.Random(seed)
        self.items = []
        for _ in range(n):
            length = rng.randint(5, 14)
            toks, tags = [], []
            while len(toks) < length:
                r = rng.random()
                if r < 0.15:
                    span = rng.randint(1, 2)
                    for j in range(span):
                        toks.append(rng.randint(2, 21))
                        tags.append(1 if j == 0 else 2)
                elif r < 0.3:
                    span = rng.randint(1, 3)
                    for j in range(span):
                        toks.append(rng.randint(22, 41))
                        tags.append(3 if j == 0 else 4)
                else:
                    toks.append(rng.randint(42, vocab_size - 1))
                    tags.append(0)
            self.items.append((toks[:length], tags[:length]))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        return self.items[idx]


def collate(batch):
    max_len = max(len(t) for t, _ in batch)
    tokens = torch.full((max_len, len(batch)), PAD, dtype=torch.long)
    tags = torch.zeros((max_len, len(batch)), dtype=torch.long)
    mask = torch.zeros((max_len, len(batch)), dtype=torch.bool)
    for b, (t, g) in enumerate(batch):
        tokens[: len(t), b] = torch.tensor(t)
        tags[: len(g), b] = torch.tensor(g)
        mask[: len(t), b] = True
    return tokens, tags, mask


def train(args):
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.use_deterministic_algorithms(True)

    train_set = ToyNERDataset(512, seed=1)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, collate_fn=collate)
    model = BiLSTMCRF(vocab_size=200, num_tags=len(TAGS))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    step = 0
    for epoch in range(args.epochs):
        for tokens, tags, mask in loader:
            loss = model.neg_log_likelihood(tokens, tags, mask) / tokens.size(1)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 5 == 0:
                print(f"epoch {epoch} step {step:4d}  nll {loss.item():.4f}")
            step += 1
    print("done")


def main():
    parser = argparse.ArgumentParser(description="Train a BiLSTM-CRF tagger")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--seed", type=int, default=13)
    train(parser.parse_args())


if __name__ == "__main__":
    main()
