"""FAQ retrieval: a siamese bag-of-words dual encoder (SBERT-style mean pooling +
Normalize) trained with in-batch negatives, Lightning ``precision="16-true"``.

Reproduces pytorch/pytorch#32137 ("torch.nn.functional.normalize epsilon too small for
half precision"): F.normalize divides by ``norm.clamp_min(eps)`` with eps=1e-12, which is
0 in float16, so a vector whose norm is 0 gives 0 / 0 = NaN.  Here a few user questions
are pure filler ("hi??", "please help") and are empty after stop-word cleaning; their
masked mean pooling is the zero vector.  In float32 the clamp turns it into a harmless
zero embedding, but under 16-true the first batch that contains such a question makes the
similarity matrix, the loss and then every weight NaN.  Fix (maintainers: pass an eps
that half precision can represent): ``F.normalize(emb, p=2, dim=-1, eps=1e-4)`` (or
normalise in float32).
"""
import argparse
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import lightning as L

STOPWORDS = {"the", "a", "an", "is", "to", "my", "i", "how", "do", "can", "please", "help",
             "hi", "hello", "thanks", "?", "??", "!", "what", "why", "it", "me", "you"}
FILLER = ["hi ??", "please help", "hello ?", "help me please !!", "thanks ?"]


def build_corpus(n_topics, pairs_per_topic, n_empty, rng):
    """Synthetic FAQ log: (user question, answer snippet) pairs per topic."""
    topic_words = [[f"t{t}w{i}" for i in range(12)] for t in range(n_topics)]
    shared = [f"g{i}" for i in range(60)]
    pairs = []
    for t in range(n_topics):
        for _ in range(pairs_per_topic):
            q = rng.sample(topic_words[t], rng.randint(2, 5)) + rng.sample(shared, rng.randint(0, 3))
            q += rng.sample(sorted(STOPWORDS), rng.randint(1, 4))
            rng.shuffle(q)
            a = rng.sample(topic_words[t], rng.randint(4, 8)) + rng.sample(shared, rng.randint(2, 6))
            rng.shuffle(a)
            pairs.append((" ".join(q), " ".join(a)))
    # a handful of logged questions carry no content at all
    for i in range(n_empty):
        t = rng.randrange(n_topics)
        a = rng.sample(topic_words[t], 6) + rng.sample(shared, 3)
        pairs.append((rng.choice(FILLER), " ".join(a)))
    rng.shuffle(pairs)
    return pairs


class Tokenizer:
    def __init__(self, texts, max_len):
        words = sorted({w for t in texts for w in t.split() if w not in STOPWORDS})
        self.vocab = {w: i + 1 for i, w in enumerate(words)}     # 0 = [PAD]
        self.max_len = max_len

    def __call__(self, text):
        ids = [self.vocab[w] for w in text.lower().split() if w in self.vocab][: self.max_len]
        return ids + [0] * (self.max_len - len(ids))


class FAQPairs(Dataset):
    def __init__(self, pairs, tok):
        self.q = torch.tensor([tok(q) for q, _ in pairs])
        self.a = torch.tensor([tok(a) for _, a in pairs])

    def __len__(self):
        return len(self.q)

    def __getitem__(self, i):
        return self.q[i], self.a[i]


class BowEncoder(nn.Module):
    def __init__(self, vocab_size, dim):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, ids):
        mask = (ids != 0).unsqueeze(-1).to(self.emb.weight.dtype)
        h = self.emb(ids)
        h = h + self.ff(h)
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1.0)   # mean pooling
        return F.normalize(pooled, p=2, dim=-1)                     # Normalize()


class DualEncoder(L.LightningModule):
    def __init__(self, vocab_size, dim=64, scale=20.0, lr=0.1, log_every=10):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = BowEncoder(vocab_size, dim)

    def training_step(self, batch, batch_idx):
        q, a = batch
        sims = self.encoder(q) @ self.encoder(a).t() * self.hparams.scale
        labels = torch.arange(len(q), device=q.device)
        loss = F.cross_entropy(sims, labels)                       # MultipleNegativesRankingLoss
        acc = (sims.argmax(1) == labels).float().mean()
        if self.global_step % self.hparams.log_every == 0:
            print(f"epoch {self.current_epoch} step {self.global_step:4d} | loss {loss.item():.4f} "
                  f"| in-batch acc {acc.item():.3f}", flush=True)
        return loss

    def validation_step(self, batch, batch_idx):
        q, a = batch
        sims = self.encoder(q) @ self.encoder(a).t() * self.hparams.scale
        labels = torch.arange(len(q), device=q.device)
        self.log("val_loss", F.cross_entropy(sims, labels), prog_bar=False)
        self.log("val_acc", (sims.argmax(1) == labels).float().mean(), prog_bar=False)

    def on_validation_epoch_end(self):
        m = self.trainer.callback_metrics
        if "val_loss" in m:
            print(f"epoch {self.current_epoch} | val_loss {m['val_loss'].item():.4f} "
                  f"| val_acc {m['val_acc'].item():.3f}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--precision", default="16-true")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=2)
    args = p.parse_args()

    L.seed_everything(args.seed, verbose=False)
    rng = random.Random(args.seed)
    pairs = build_corpus(n_topics=40, pairs_per_topic=60, n_empty=3, rng=rng)
    val_pairs = build_corpus(n_topics=40, pairs_per_topic=8, n_empty=0, rng=rng)
    tok = Tokenizer([t for pr in pairs for t in pr], max_len=16)
    train_dl = DataLoader(FAQPairs(pairs, tok), batch_size=args.batch_size, shuffle=True, drop_last=True)
    val_dl = DataLoader(FAQPairs(val_pairs, tok), batch_size=64)

    model = DualEncoder(vocab_size=len(tok.vocab) + 1)
    trainer = L.Trainer(accelerator="cpu", devices=1, precision=args.precision, max_epochs=args.epochs,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, train_dl, val_dl)


if __name__ == "__main__":
    main()
