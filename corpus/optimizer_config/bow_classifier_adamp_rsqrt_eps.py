"""Bag-of-words topic classifier trained with AdamP (Heo et al., 2021).

AdamP is vendored below (trimmed from pytorch_optimizer) to avoid the extra
dependency.  Tokens follow a Zipf distribution, so many rare words
only show up after a few hundred documents.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import Optimizer


# ------------------------------------------------------------------ optim/adamp.py
def channel_view(x):
    return x.view(x.size(0), -1)


def layer_view(x):
    return x.view(1, -1)


def cosine_similarity_by_view(x, y, eps, view_func):
    return F.cosine_similarity(view_func(x), view_func(y), dim=1, eps=eps).abs_()


def projection(p, grad, perturb, delta, wd_ratio, eps):
    wd = 1.0
    expand_size = (-1,) + (1,) * (len(p.shape) - 1)
    for view_func in (channel_view, layer_view):
        cosine_sim = cosine_similarity_by_view(grad, p, eps, view_func)
        if cosine_sim.max() < delta / math.sqrt(view_func(p).size(1)):
            p_n = p / view_func(p).norm(dim=1).view(expand_size).add_(eps)
            perturb -= p_n * view_func(p_n * perturb).sum(dim=1).view(expand_size)
            wd = wd_ratio
            return perturb, wd
    return perturb, wd


class AdamP(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 delta=0.1, wd_ratio=0.1, nesterov=False):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        delta=delta, wd_ratio=wd_ratio, nesterov=nesterov)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                bias_correction1 = 1 - beta1 ** state["step"]
                bias_correction2_sq = math.sqrt(1 - beta2 ** state["step"])

                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                inv_de_nom = exp_avg_sq.rsqrt().add_(group["eps"]).mul_(bias_correction2_sq)

                if group["nesterov"]:
                    perturb = exp_avg.mul(beta1).addcmul_(grad, inv_de_nom, value=1 - beta1)
                else:
                    perturb = exp_avg * inv_de_nom

                wd_ratio = 1.0
                if len(p.shape) > 1:
                    perturb, wd_ratio = projection(p, grad, perturb, group["delta"], group["wd_ratio"], group["eps"])

                if group["weight_decay"] > 0:
                    p.mul_(1 - group["lr"] * group["weight_decay"] * wd_ratio)
                p.add_(perturb, alpha=-group["lr"] / bias_correction1)


# ------------------------------------------------------------------ data / model
def make_corpus(n_docs, vocab, n_topics, doc_len, gen):
    ranks = torch.arange(1, vocab + 1, dtype=torch.float)
    zipf = 1.0 / ranks ** 1.1
    topic_words = torch.randint(0, vocab, (n_topics, 12), generator=gen)
    docs, labels = [], []
    for i in range(n_docs):
        topic = i % n_topics
        background = torch.multinomial(zipf, doc_len - 6, replacement=True, generator=gen)
        keywords = topic_words[topic][torch.randint(0, 12, (6,), generator=gen)]
        doc = torch.cat([background, keywords])
        docs.append(doc[torch.randperm(doc_len, generator=gen)])
        labels.append(topic)
    return torch.stack(docs), torch.tensor(labels)


class BowClassifier(nn.Module):
    def __init__(self, vocab, dim, n_topics):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, n_topics)

    def forward(self, docs):
        h = self.emb(docs).mean(dim=1)
        return self.out(torch.relu(self.hidden(h)))


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    vocab, n_topics = 2000, 5
    docs, labels = make_corpus(2000, vocab, n_topics, doc_len=40, gen=gen)

    model = BowClassifier(vocab, 32, n_topics)
    opt = AdamP(model.parameters(), lr=3e-3, weight_decay=1e-2)

    bs = 32
    for epoch in range(2):
        perm = torch.randperm(len(docs), generator=gen)
        for it in range(len(docs) // bs):
            idx = perm[it * bs : (it + 1) * bs]
            logits = model(docs[idx])
            loss = F.cross_entropy(logits, labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if it % 5 == 0:
                acc = (logits.argmax(1) == labels[idx]).float().mean().item()
                print(f"epoch {epoch} it {it:3d} loss {loss.item():.4f} acc {acc:.2f}")


if __name__ == "__main__":
    main()
