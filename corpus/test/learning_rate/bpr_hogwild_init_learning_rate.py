"""BPR matrix factorisation for implicit feedback, ported to PyTorch from a
qmf-style command-line tool (flags named like qmf's ``bpr`` binary).

Setting: Bayesian Personalised Ranking on (user, positive item, sampled negative
item) triplets, plain SGD where every triplet gets a full ``lr`` step (qmf does
per-triplet Hogwild updates; here a mini-batch of triplets with a *summed* loss,
which is the same update), L2 on the factors, learning rate decayed by
``--decay_rate`` after every epoch, train/test loss estimated on fixed evaluation
triplets after each epoch.

Bug (https://github.com/quora/qmf/issues/11): with a too large
``--init_learning_rate`` the train and test losses are infinite from the start of
training to its end.  Every SGD step moves p_u by lr * e * (q_i - q_j) and q_i, q_j
by lr * e * p_u; at lr = 1.0 that multiplicative feedback makes the factors grow
geometrically (avg triplet loss 1.9 at update 100, 9e7 at update 200, 3e29 at
update 500), at update 572 of epoch 1 (max |p_u| ~1.3e19) the score difference
p_u'(q_i - q_j) overflows float32 and the loss is inf; at update 590 the loss
and the factors are NaN, and every later loss (train and test) is nan.

Fix (maintainer's answer in the issue, confirmed by the reporter, and the error
message qmf then added: "try decreasing the learning rate (--init_learning_rate)"):
use a smaller initial learning rate - qmf's own default 0.05 trains fine here
(eval loss 0.693 -> 0.328 train, 0.233 test, no inf/nan).
"""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_flags():
    parser = argparse.ArgumentParser(description="BPR (qmf flags)")
    parser.add_argument("--nepochs", type=int, default=6, help="number of epochs for SGD")
    parser.add_argument("--nfactors", type=int, default=30, help="dimension of learned factors")
    parser.add_argument("--init_learning_rate", type=float, default=1.0, help="initial learning rate")
    parser.add_argument("--bias_lambda", type=float, default=1.0, help="regularization on biases")
    parser.add_argument("--user_lambda", type=float, default=0.025, help="regularization on user factors")
    parser.add_argument("--item_lambda", type=float, default=0.0025, help="regularization on item factors")
    parser.add_argument("--decay_rate", type=float, default=0.9, help="decay rate on learning rate")
    parser.add_argument("--use_biases", action="store_true", help="use bias term")
    parser.add_argument("--init_distribution_bound", type=float, default=0.01, help="init distribution bound")
    parser.add_argument("--num_negative_samples", type=int, default=3,
                        help="number of negative items to sample for each positive item")
    parser.add_argument("--num_hogwild_threads", type=int, default=64,
                        help="triplets updated together (one summed SGD step)")
    parser.add_argument("--eval_num_neg", type=int, default=3,
                        help="number of negatives generated per positive in evaluation")
    parser.add_argument("--eval_seed", type=int, default=42, help="random seed for generating evaluation set")
    parser.add_argument("--log_every", type=int, default=100, help="log running loss every N updates")
    return parser.parse_args()


def make_dataset(seed=0, nusers=600, nitems=400, per_user=31):
    """Synthetic implicit feedback: each user's top items under a noisy low-rank
    taste model become (user, item, 1.0) rows, one per user held out for test."""
    rng = np.random.RandomState(seed)
    taste_u = rng.randn(nusers, 8)
    taste_i = rng.randn(nitems, 8)
    scores = taste_u @ taste_i.T + 2.0 * rng.randn(nusers, nitems)
    train, test = [], []
    for u in range(nusers):
        top = np.argsort(-scores[u])[:per_user]
        test.append((u, int(top[0]), 1.0))
        train.extend((u, int(i), 1.0) for i in top[1:])
    return train, test


class BPREngine:
    def __init__(self, flags):
        self.flags = flags
        self.gen = np.random.RandomState(0)

    # ---------------------------------------------------------------- data
    def init(self, dataset):
        self.data = np.array([(u, i) for u, i, v in dataset if v >= 1.0], dtype=np.int64)
        self.nusers = int(self.data[:, 0].max()) + 1
        self.nitems = int(self.data[:, 1].max()) + 1
        self.item_map = [set() for _ in range(self.nusers)]
        for u, i in self.data:
            self.item_map[u].add(int(i))
        self.eval_set = self.sample_triplets(self.data, self.flags.eval_num_neg,
                                             np.random.RandomState(self.flags.eval_seed))

        f = self.flags
        self.learning_rate = f.init_learning_rate
        self.user_factors = nn.Embedding(self.nusers, f.nfactors)
        self.item_factors = nn.Embedding(self.nitems, f.nfactors)
        self.item_biases = nn.Embedding(self.nitems, 1)
        for emb in (self.user_factors, self.item_factors, self.item_biases):
            nn.init.uniform_(emb.weight, -f.init_distribution_bound, f.init_distribution_bound)
        params = list(self.user_factors.parameters()) + list(self.item_factors.parameters())
        if f.use_biases:
            params += list(self.item_biases.parameters())
        self.optimizer = torch.optim.SGD(params, lr=self.learning_rate)

    def init_test(self, test_dataset):
        test = np.array([(u, i) for u, i, v in test_dataset if v >= 1.0], dtype=np.int64)
        self.test_eval_set = self.sample_triplets(test, self.flags.eval_num_neg,
                                                  np.random.RandomState(self.flags.eval_seed))

    def sample_negative(self, user, gen):
        while True:
            j = gen.randint(self.nitems)
            if j not in self.item_map[user]:
                return j

    def sample_triplets(self, pairs, num_neg, gen):
        out = [(u, i, self.sample_negative(u, gen)) for u, i in pairs for _ in range(num_neg)]
        return torch.tensor(out, dtype=torch.long)

    # ---------------------------------------------------------------- model
    def predict_difference(self, triplets):
        u, i, j = triplets[:, 0], triplets[:, 1], triplets[:, 2]
        pu, qi, qj = self.user_factors(u), self.item_factors(i), self.item_factors(j)
        pred = (pu * (qi - qj)).sum(dim=1)
        if self.flags.use_biases:
            pred = pred + (self.item_biases(i) - self.item_biases(j)).squeeze(1)
        return pred, (pu, qi, qj)

    def update(self, triplets):
        f = self.flags
        diff, (pu, qi, qj) = self.predict_difference(triplets)
        # -log sigmoid(x_uij), summed: one full-lr step per triplet, as in qmf
        loss = F.softplus(-diff).sum()
        reg = 0.5 * (f.user_lambda * pu.pow(2).sum()
                     + f.item_lambda * (qi.pow(2).sum() + qj.pow(2).sum()))
        self.optimizer.zero_grad()
        (loss + reg).backward()
        self.optimizer.step()
        return loss.item()

    @torch.no_grad()
    def eval_loss(self, triplets):
        diff, _ = self.predict_difference(triplets)
        return F.softplus(-diff).mean().item()

    def evaluate(self, epoch):
        print("epoch %d: train loss = %.6f, test loss = %.6f, lr = %.4f"
              % (epoch, self.eval_loss(self.eval_set), self.eval_loss(self.test_eval_set),
                 self.learning_rate), flush=True)

    def optimize(self):
        f = self.flags
        for epoch in range(1, f.nepochs + 1):
            order = self.gen.permutation(len(self.data))
            triplets = self.sample_triplets(self.data[order], f.num_negative_samples, self.gen)
            running, n = 0.0, 0
            for b, start in enumerate(range(0, len(triplets), f.num_hogwild_threads), 1):
                block = triplets[start:start + f.num_hogwild_threads]
                running += self.update(block)
                n += len(block)
                if b % f.log_every == 0:
                    print("epoch %d, update %d: avg triplet loss = %.6f" % (epoch, b, running / n), flush=True)
                    running, n = 0.0, 0
            self.evaluate(epoch)
            # update learning rate
            if f.decay_rate < 1.0:
                self.learning_rate *= f.decay_rate
                for group in self.optimizer.param_groups:
                    group["lr"] = self.learning_rate


def main():
    flags = parse_flags()
    torch.manual_seed(0)
    train, test = make_dataset()
    engine = BPREngine(flags)
    t0 = time.time()
    engine.init(train)
    engine.init_test(test)
    print("%d users, %d items, %d positives" % (engine.nusers, engine.nitems, len(engine.data)))
    engine.optimize()
    print("done in %.1fs" % (time.time() - t0))


if __name__ == "__main__":
    main()
