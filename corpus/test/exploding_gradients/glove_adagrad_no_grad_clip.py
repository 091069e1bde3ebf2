"""GloVe: Global Vectors for Word Representation -- a PyTorch port of glove.c.

Setting
-------
A straight port of Stanford's ``glove.c`` trainer (weighted least squares on the
log co-occurrence counts, one vector and one bias per word and per context word,
glove.c's own AdaGrad: ``gradsq`` starts at 1.0 and the step is taken *before* the
squared step is added, so the very first step is a plain ``eta * grad``).
Options are read the glove.c way (``-vector-size 500 -eta 0.05 ...``), the
co-occurrence records (``word1, word2, val``; 1-based like the CREC struct in
cooccurrence.shuf.bin) are generated here: a small vocabulary (100 words, picked
on purpose, like the reporter's < 5000-word vocabulary) seen in a huge corpus, so
the counts run up to ~1e10, with large vectors (500 dims, as in the report).  The port updates from mini-batches of 1024 records instead of one
record per Hogwild thread, so a word's gradient is summed over the ~10 records
it has in a batch.

Bug
---
Nothing bounds the gradient components.  The cost goes down for two iterations (15.5, 7.8)
while the word/context vectors grow to fit log counts of ~20; in the third iteration the
largest per-component gradient of a batch climbs 10 -> 223 and, since glove.c's AdaGrad takes
the step before adding the squared step, each spike is taken almost at full size: the vectors
go 6 -> 52 -> 1e4 -> 5e9 -> 4e20 (gradients 2e3 -> 4e5 -> 1e12 -> 2e26) within five batches of
iteration 4, the squared error overflows to inf and the cost prints ``nan`` from iteration 4
on ("cost: -nan" in the report).  Lowering eta did not help the reporter (tried 0.05 ...
0.0001).

Fix
---
glove.c gained gradient-component clipping (``-grad-clip``, default 10, later
100): every component of the word-vector gradient is clipped to
[-grad_clip, grad_clip] before the AdaGrad step, learning rate left at 0.05.
Here: ``torch.nn.utils.clip_grad_value_(model.W, grad_clip_value)`` right after
``loss.backward()``.

Report: https://github.com/stanfordnlp/GloVe/pull/149 ("Fix nan during training":
"default learning rate causes on some data exploding gradients, and, as a
result, +-Infs and NaNs ... Now, there is a gradient components clipping
parameter"), merged by the maintainer as the answer to
https://github.com/stanfordnlp/GloVe/issues/156 ("cost: -nan" after a few
iterations, small vocabulary, vector size 500/1000).
"""
import sys
import time

import numpy as np
import torch
import torch.nn as nn

# ---- defaults, as in glove.c ------------------------------------------------
verbose = 2
vector_size = 500       # reporter: 500 and 1000
num_iter = 10
records_per_step = 1024
eta = 0.05              # Initial learning rate
alpha = 0.75
x_max = 100.0           # Weighting function parameters
vocab_size = 100        # small vocabulary, huge corpus
seed = 0


def find_arg(name, argv):
    for i in range(1, len(argv)):
        if argv[i] == name:
            if i == len(argv) - 1:
                print("No argument given for %s" % name)
                sys.exit(1)
            return i
    return -1


def read_cooccurrence(vocab_size, seed):
    """Stand-in for reading cooccurrence.shuf.bin: CREC records (word1, word2, val)."""
    rng = np.random.RandomState(seed)
    rank = 16
    U = rng.randn(vocab_size, rank) * 2.5 / rank ** 0.25
    V = rng.randn(vocab_size, rank) * 2.5 / rank ** 0.25
    p = 1.0 / np.arange(1, vocab_size + 1)          # Zipf unigram counts
    p /= p.sum()
    log_x = np.log(1e9) + np.log(np.outer(p, p)) + np.clip(U @ V.T, -8, 8)
    x = np.floor(np.exp(log_x))
    w1, w2 = np.nonzero(x >= 1)
    order = rng.permutation(len(w1))                 # "shuffle"
    w1, w2 = w1[order] + 1, w2[order] + 1            # 1-based word ids
    val = x[w1 - 1, w2 - 1]
    return (torch.from_numpy(w1).long(), torch.from_numpy(w2).long(),
            torch.from_numpy(val).float())


class GloVe(nn.Module):
    def __init__(self, vocab_size, vector_size):
        super().__init__()
        # rows [0, vocab_size) word vectors, rows [vocab_size, 2*vocab_size) context vectors
        self.W = nn.Parameter((torch.rand(2 * vocab_size, vector_size) - 0.5) / vector_size)
        self.b = nn.Parameter((torch.rand(2 * vocab_size) - 0.5) / vector_size)

    def forward(self, l1, l2, log_val):
        diff = (self.W[l1] * self.W[l2]).sum(1) + self.b[l1] + self.b[l2] - log_val
        return diff


class GloveAdaGrad(torch.optim.Optimizer):
    """AdaGrad exactly as glove.c does it (gradsq starts at 1, update before accumulate)."""

    def __init__(self, params, lr):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group['params']:
                if p.grad is None:
                    continue
                state = self.state[p]
                if 'gradsq' not in state:
                    state['gradsq'] = torch.ones_like(p)  # So initial value of eta is equal to initial learning rate
                temp = group['lr'] * p.grad
                p.sub_(temp / state['gradsq'].sqrt())
                state['gradsq'].add_(temp * temp)


def train_glove(model, optimizer, w1, w2, val):
    num_lines = len(val)
    l1_all = w1 - 1                       # word vectors
    l2_all = (w2 - 1) + vocab_size        # shift by vocab_size to get separate context vectors
    log_val_all = torch.log(val)
    weight_all = torch.where(val > x_max, torch.ones_like(val), (val / x_max) ** alpha)
    if verbose > 0:
        print("Training model...")
    for it in range(num_iter):
        t0 = time.time()
        total_cost = 0.0
        perm = torch.randperm(num_lines)
        for start in range(0, num_lines, records_per_step):
            idx = perm[start:start + records_per_step]
            diff = model(l1_all[idx], l2_all[idx], log_val_all[idx])
            fdiff = weight_all[idx] * diff
            loss = 0.5 * (fdiff * diff).sum()             # weighted squared error
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total_cost += loss.item()
        print("%s, iter: %03d, cost: %f" % (time.strftime("%x - %H:%M.%S"), it + 1,
                                             total_cost / num_lines))
    return 0


def main(argv):
    global vector_size, num_iter, eta, alpha, x_max, records_per_step, seed
    if (i := find_arg("-vector-size", argv)) > 0: vector_size = int(argv[i + 1])
    if (i := find_arg("-iter", argv)) > 0: num_iter = int(argv[i + 1])
    if (i := find_arg("-eta", argv)) > 0: eta = float(argv[i + 1])
    if (i := find_arg("-alpha", argv)) > 0: alpha = float(argv[i + 1])
    if (i := find_arg("-x-max", argv)) > 0: x_max = float(argv[i + 1])
    if (i := find_arg("-batch", argv)) > 0: records_per_step = int(argv[i + 1])
    if (i := find_arg("-seed", argv)) > 0: seed = int(argv[i + 1])

    torch.manual_seed(seed)
    if verbose > 0:
        print("TRAINING MODEL")
    w1, w2, val = read_cooccurrence(vocab_size, seed)
    if verbose > 1:
        print("Read %d lines." % len(val))
        print("Initializing parameters...", end="")
    model = GloVe(vocab_size, vector_size)
    optimizer = GloveAdaGrad(model.parameters(), lr=eta)
    if verbose > 1:
        print("done.")
        print("vector size: %d" % vector_size)
        print("vocab size: %d" % vocab_size)
        print("x_max: %f" % x_max)
        print("alpha: %f" % alpha)
    return train_glove(model, optimizer, w1, w2, val)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
