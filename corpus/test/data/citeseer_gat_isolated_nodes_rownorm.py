"""Graph attention network (Velickovic et al.) on a Citeseer-like citation graph.

Planetoid-style loading (allx / tx / test.index), row-normalised bag-of-words
features, two GAT layers with dense adjacency masking, full-batch Adam.
"""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def sample_mask(idx, n):
    mask = np.zeros(n, dtype=bool)
    mask[idx] = True
    return mask


def synth_planetoid(rng, n_train_pool=420, n_test_range=200, n_isolated=6,
                    n_feat=300, n_class=6):
    """Build the arrays the ind.citeseer.* pickles hold."""
    n_all = n_train_pool + n_test_range
    labels_all = rng.integers(0, n_class, n_all)
    topic_words = rng.random((n_class, n_feat)) < 0.06
    feats = (rng.random((n_all, n_feat)) < 0.015) | (topic_words[labels_all] & (rng.random((n_all, n_feat)) < 0.5))
    feats = feats.astype(np.float32)
    onehot = np.eye(n_class, dtype=np.float32)[labels_all]

    # some test ids never made it into tx/ty (isolated papers in the graph)
    test_ids = np.arange(n_train_pool, n_all)
    missing = rng.choice(test_ids, n_isolated, replace=False)
    test_index = np.setdiff1d(test_ids, missing)
    rng.shuffle(test_index)

    edges = []
    for i in range(n_all):
        if i in missing:
            continue
        same = np.flatnonzero((labels_all == labels_all[i]) & ~np.isin(np.arange(n_all), missing))
        for j in rng.choice(same, 2):
            if j != i:
                edges.append((i, j))
        if rng.random() < 0.3:
            j = rng.integers(0, n_all)
            if j not in missing and j != i:
                edges.append((i, j))
    return {
        "allx": feats[:n_train_pool], "ally": onehot[:n_train_pool],
        "tx": feats[np.sort(test_index)], "ty": onehot[np.sort(test_index)],
        "test_index": test_index, "edges": edges, "n_train": 120,
    }


def load_data(seed=0):
    rng = np.random.default_rng(seed)
    raw = synth_planetoid(rng)
    allx, ally, tx, ty = raw["allx"], raw["ally"], raw["tx"], raw["ty"]
    test_idx_reorder = raw["test_index"]
    test_idx_range = np.sort(test_idx_reorder)

    # Fix citeseer dataset (there are some isolated nodes in the graph):
    # add them as zero-vecs into the right position
    test_idx_range_full = range(test_idx_reorder.min(), test_idx_reorder.max() + 1)
    tx_extended = np.zeros((len(test_idx_range_full), allx.shape[1]), dtype=np.float32)
    tx_extended[test_idx_range - test_idx_range.min(), :] = tx
    ty_extended = np.zeros((len(test_idx_range_full), ally.shape[1]), dtype=np.float32)
    ty_extended[test_idx_range - test_idx_range.min(), :] = ty

    features = np.vstack([allx, tx_extended])
    labels = np.vstack([ally, ty_extended])
    n = features.shape[0]
    adj = np.zeros((n, n), dtype=np.float32)
    for i, j in raw["edges"]:
        adj[i, j] = adj[j, i] = 1.0

    idx_train = np.arange(raw["n_train"])
    idx_val = np.arange(raw["n_train"], raw["n_train"] + 200)
    return adj, features, labels, idx_train, idx_val, test_idx_range


class GraphAttention(nn.Module):
    def __init__(self, f_in, f_out, heads, concat=True, dropout=0.6):
        super().__init__()
        self.heads, self.f_out, self.concat, self.dropout = heads, f_out, concat, dropout
        self.kernel = nn.Parameter(torch.empty(heads, f_in, f_out))
        self.attn_self = nn.Parameter(torch.empty(heads, f_out, 1))
        self.attn_neigh = nn.Parameter(torch.empty(heads, f_out, 1))
        for p in (self.kernel, self.attn_self, self.attn_neigh):
            nn.init.xavier_uniform_(p)

    def forward(self, x, a):
        h = torch.einsum("nf,hfo->hno", x, self.kernel)          # H x N x F'
        f1 = h @ self.attn_self                                   # H x N x 1
        f2 = h @ self.attn_neigh
        e = F.leaky_relu(f1 + f2.transpose(1, 2), 0.2)            # H x N x N
        e = e + (-10e9 * (1.0 - a))
        att = F.dropout(torch.softmax(e, dim=-1), self.dropout, self.training)
        h = F.dropout(h, self.dropout, self.training)
        out = att @ h
        if self.concat:
            return out.permute(1, 0, 2).reshape(x.shape[0], -1)
        return out.mean(0)


class GAT(nn.Module):
    def __init__(self, f_in, n_class, hidden=8, heads=8, dropout=0.6):
        super().__init__()
        self.dropout = dropout
        self.gat1 = GraphAttention(f_in, hidden, heads, concat=True, dropout=dropout)
        self.gat2 = GraphAttention(hidden * heads, n_class, 1, concat=False, dropout=dropout)

    def forward(self, x, a):
        x = F.dropout(x, self.dropout, self.training)
        x = F.elu(self.gat1(x, a))
        x = F.dropout(x, self.dropout, self.training)
        return self.gat2(x, a)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--l2", type=float, default=5e-4)
    args = parser.parse_args()
    torch.manual_seed(0)

    A, X, Y, idx_train, idx_val, idx_test = load_data()

    # Preprocessing operations
    X /= X.sum(1).reshape(-1, 1)
    A = A + np.eye(A.shape[0], dtype=np.float32)  # add self-loops

    x = torch.from_numpy(X)
    a = torch.from_numpy(A)
    y = torch.from_numpy(Y.argmax(1))
    model = GAT(x.shape[1], Y.shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.l2)

    for epoch in range(args.epochs):
        model.train()
        opt.zero_grad()
        out = model(x, a)
        loss = F.cross_entropy(out[idx_train], y[idx_train])
        loss.backward()
        opt.step()

        model.eval()
        with torch.no_grad():
            out = model(x, a)
            val_loss = F.cross_entropy(out[idx_val], y[idx_val]).item()
            val_acc = (out[idx_val].argmax(1) == y[idx_val]).float().mean().item()
        print(f"epoch {epoch:3d} loss {loss.item():.4f} val_loss {val_loss:.4f} val_acc {val_acc:.3f}")

    with torch.no_grad():
        test_acc = (model(x, a)[idx_test].argmax(1) == y[idx_test]).float().mean().item()
    print(f"test accuracy {test_acc:.3f}")


if __name__ == "__main__":
    main()
