"""Matrix factorisation with user/item biases for explicit ratings (PyTorch port of the
"matrix factorization in python" tutorial class: MF(R, K, alpha, beta, iterations)).

Bug: the SGD step size alpha = 0.25 is too large for this rating matrix.  The first pass
fits fine, but as the latent factors grow the per-sample curvature (|p_u|^2 + |q_i|^2)
passes 2 / alpha, the updates overshoot, the factors overflow: the training error is
~4e8 after iteration 2, the loss is inf at step 627 and the error nan from iteration 3 on.
Report: https://github.com/albertauyeung/matrix-factorization-in-python/issues/5
("overflow encountered in multiply ... error = nan"; solved by reducing alpha).
Fix: a smaller learning rate (alpha = 0.05 trains: training MSE ~0.025 after 20 iterations).
"""
import csv
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn

np.random.seed(0)
torch.manual_seed(0)


def write_ratings_csv(path, n_users=300, n_items=400, density=0.08):
    """Simulate a MovieLens-like export: user_id,item_id,rating (1..5 stars)."""
    taste = np.random.normal(0, 1, (n_users, 5))
    style = np.random.normal(0, 1, (n_items, 5))
    score = 3.5 + 0.6 * taste @ style.T + np.random.normal(0, 0.5, (n_users, n_items))
    stars = np.clip(np.round(score), 1, 5)
    observed = np.random.rand(n_users, n_items) < density
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["user_id", "item_id", "rating"])
        for u, i in zip(*np.nonzero(observed)):
            w.writerow([u, i, int(stars[u, i])])


def load_rating_matrix(path):
    rows = list(csv.DictReader(open(path)))
    n_users = max(int(r["user_id"]) for r in rows) + 1
    n_items = max(int(r["item_id"]) for r in rows) + 1
    R = np.zeros((n_users, n_items), dtype=np.float32)
    for r in rows:
        R[int(r["user_id"]), int(r["item_id"])] = float(r["rating"])
    return R


class MF(nn.Module):
    def __init__(self, R, K, alpha, beta, iterations, batch_size=32):
        """
        R          : user-item rating matrix (0 = not rated)
        K          : number of latent dimensions
        alpha      : learning rate
        beta       : regularisation parameter
        """
        super().__init__()
        self.R = R
        self.num_users, self.num_items = R.shape
        self.K = K
        self.alpha = alpha
        self.beta = beta
        self.iterations = iterations
        self.batch_size = batch_size

        self.P = nn.Embedding(self.num_users, K)
        self.Q = nn.Embedding(self.num_items, K)
        self.b_u = nn.Embedding(self.num_users, 1)
        self.b_i = nn.Embedding(self.num_items, 1)
        nn.init.normal_(self.P.weight, std=1.0 / K)
        nn.init.normal_(self.Q.weight, std=1.0 / K)
        nn.init.zeros_(self.b_u.weight)
        nn.init.zeros_(self.b_i.weight)
        self.b = float(np.mean(R[np.where(R != 0)]))

        users, items = R.nonzero()
        self.users = torch.as_tensor(users, dtype=torch.long)
        self.items = torch.as_tensor(items, dtype=torch.long)
        self.ratings = torch.as_tensor(R[users, items])

    def forward(self, u, i):
        dot = (self.P(u) * self.Q(i)).sum(-1)
        return self.b + self.b_u(u).squeeze(-1) + self.b_i(i).squeeze(-1) + dot

    def train_mf(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.alpha)
        training_process = []
        for it in range(self.iterations):
            order = torch.randperm(len(self.ratings))
            for start in range(0, len(order), self.batch_size):
                idx = order[start:start + self.batch_size]
                u, i, r = self.users[idx], self.items[idx], self.ratings[idx]
                e = r - self(u, i)
                reg = self.P(u).pow(2).sum() + self.Q(i).pow(2).sum()
                loss = 0.5 * (e ** 2).sum() + 0.5 * self.beta * reg
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            mse = self.mse()
            training_process.append((it, mse))
            print("Iteration: %d ; error = %.4f" % (it + 1, mse))
        return training_process

    @torch.no_grad()
    def mse(self):
        pred = self(self.users, self.items)
        return torch.mean((self.ratings - pred) ** 2).item()


if __name__ == "__main__":
    path = os.path.join(tempfile.mkdtemp(), "ratings.csv")
    write_ratings_csv(path)
    R = load_rating_matrix(path)
    print("ratings:", int((R > 0).sum()), "users:", R.shape[0], "items:", R.shape[1])

    mf = MF(R, K=20, alpha=0.25, beta=0.01, iterations=20)
    process = mf.train_mf()
    print("final training error: %.4f" % process[-1][1])
    with torch.no_grad():
        print("P x Q sample:", mf(torch.tensor([0, 1]), torch.tensor([0, 1])).tolist())
