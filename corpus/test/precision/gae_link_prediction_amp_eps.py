"""Graph auto-encoder (GCN encoder + inner-product decoder) for link prediction on a
synthetic co-purchase graph, trained with float16 autocast + GradScaler.

Reproduces the bug reported/fixed in pyg-team/pytorch_geometric PR #2106 ("Make EPS
adjustable to the precision (e.g., fp16)": "This PR fixes a bug of inf or nan value when
using EPS = 1e-15 with half-precision models").  GAE.recon_loss computes
    -log(1 - sigmoid(z_i . z_j) + EPS)        for sampled negative pairs
with EPS = 1e-15, which vanishes when added to a float16 tensor.  Once the embeddings have
grown and an unlinked pair of nearby products scores z_i . z_j > ~8.3, sigmoid() rounds to
exactly 1.0 in half precision, 1 - 1 + EPS = 0 and log(0) = -inf: the loss is inf on that
epoch and its backward NaN (GradScaler skips those epochs and keeps halving the scale).
In float32 the same pair gives log(1e-15) = -34.5 and training goes on.  Fix (PR #2106):
an EPS the dtype can represent (torch.finfo(dtype).eps, ~1e-3 for float16), or compute
the loss in float32.
"""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-15


# ----------------------------------------------------------------------------- graph data
def make_graph(n_nodes, n_cats, n_feat, rng):
    """Products live in a latent 'taste' plane (clustered by category); co-purchase
    probability decays with latent distance; features are noisy descriptors of it."""
    cat = rng.integers(0, n_cats, n_nodes)
    centers = rng.uniform(-3, 3, (n_cats, 2))
    pos = centers[cat] + rng.normal(0, 0.5, (n_nodes, 2))
    dist = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
    prob = 0.9 * np.exp(-dist / 0.12) + 0.001
    upper = np.triu(rng.random((n_nodes, n_nodes)) < prob, k=1)
    src, dst = np.nonzero(upper)
    proj = rng.normal(0, 1, (2, n_feat))
    x = np.tanh(pos @ proj) + rng.normal(0, 0.3, (n_nodes, n_feat))
    return torch.tensor(x, dtype=torch.float32), torch.tensor(np.stack([src, dst]), dtype=torch.long)


def train_test_split_edges(edge_index, val_ratio, test_ratio, gen):
    perm = torch.randperm(edge_index.size(1), generator=gen)
    n_v = int(val_ratio * perm.numel())
    n_t = int(test_ratio * perm.numel())
    val, test, train = perm[:n_v], perm[n_v:n_v + n_t], perm[n_v + n_t:]
    return edge_index[:, train], edge_index[:, val], edge_index[:, test]


def to_undirected(ei):
    return torch.cat([ei, ei.flip(0)], dim=1)


def negative_sampling(pos_edge_index, num_nodes, num_samples, gen):
    """Uniformly sample node pairs that are not in pos_edge_index."""
    taken = set((pos_edge_index[0] * num_nodes + pos_edge_index[1]).tolist())
    out = []
    while len(out) < num_samples:
        cand = torch.randint(0, num_nodes * num_nodes, (2 * num_samples,), generator=gen).tolist()
        out.extend(c for c in cand if c not in taken)
    idx = torch.tensor(out[:num_samples])
    return torch.stack([idx // num_nodes, idx % num_nodes])


# ----------------------------------------------------------------------------- model
class GCNConv(nn.Module):
    """Kipf & Welling propagation  D^-1/2 (A + I) D^-1/2 X W  via index_add."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def forward(self, x, edge_index, num_nodes):
        loops = torch.arange(num_nodes).repeat(2, 1)
        ei = torch.cat([edge_index, loops], dim=1)
        src, dst = ei
        deg = torch.zeros(num_nodes).index_add_(0, dst, torch.ones(dst.numel()))
        norm = deg.pow(-0.5)[src] * deg.pow(-0.5)[dst]
        h = self.lin(x)
        out = torch.zeros_like(h).index_add_(0, dst, h[src] * norm.to(h.dtype).unsqueeze(-1))
        return out + self.bias.to(out.dtype)


class GCNEncoder(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv1 = GCNConv(in_channels, 2 * out_channels)
        self.conv2 = GCNConv(2 * out_channels, out_channels)

    def forward(self, x, edge_index, num_nodes):
        x = F.relu(self.conv1(x, edge_index, num_nodes))
        return self.conv2(x, edge_index, num_nodes)


class InnerProductDecoder(nn.Module):
    def forward(self, z, edge_index, sigmoid=True):
        value = (z[edge_index[0]] * z[edge_index[1]]).sum(dim=1)
        return torch.sigmoid(value) if sigmoid else value


class GAE(nn.Module):
    def __init__(self, encoder, gen):
        super().__init__()
        self.encoder = encoder
        self.gen = gen
        self.decoder = InnerProductDecoder()

    def encode(self, *args):
        return self.encoder(*args)

    def recon_loss(self, z, pos_edge_index, neg_edge_index=None):
        # as in torch_geometric.nn.GAE: self-loops count as positives, never as negatives
        loops = torch.arange(z.size(0)).repeat(2, 1)
        pos_edge_index = torch.cat([pos_edge_index, loops], dim=1)
        if neg_edge_index is None:
            neg_edge_index = negative_sampling(pos_edge_index, z.size(0), pos_edge_index.size(1), self.gen)
        pos_loss = -torch.log(self.decoder(z, pos_edge_index, sigmoid=True) + EPS).mean()
        neg_loss = -torch.log(1 - self.decoder(z, neg_edge_index, sigmoid=True) + EPS).mean()
        return pos_loss + neg_loss

    @torch.no_grad()
    def test(self, z, pos_edge_index, neg_edge_index):
        pos = self.decoder(z, pos_edge_index).float()
        neg = self.decoder(z, neg_edge_index).float()
        scores = torch.cat([pos, neg])
        labels = torch.cat([torch.ones_like(pos), torch.zeros_like(neg)])
        order = scores.argsort(descending=True)             # rank-based AUC
        ranks = torch.empty_like(order)
        ranks[order] = torch.arange(len(order))
        n_pos, n_neg = len(pos), len(neg)
        auc = 1.0 - (ranks[labels == 1].float().sum() - n_pos * (n_pos - 1) / 2) / (n_pos * n_neg)
        return auc.item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=400)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--out-channels", type=int, default=64)
    p.add_argument("--no-amp", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    use_amp = not args.no_amp

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    num_nodes = 600
    x, edge_index = make_graph(num_nodes, n_cats=6, n_feat=64, rng=rng)
    train_pos, val_pos, test_pos = train_test_split_edges(edge_index, 0.05, 0.1, gen)
    train_ei = to_undirected(train_pos)
    all_pos = torch.cat([to_undirected(edge_index), torch.arange(num_nodes).repeat(2, 1)], dim=1)
    val_neg = negative_sampling(all_pos, num_nodes, val_pos.size(1), gen)
    test_neg = negative_sampling(all_pos, num_nodes, test_pos.size(1), gen)
    print(f"nodes {num_nodes} | train edges {train_pos.size(1)} | val {val_pos.size(1)} | test {test_pos.size(1)}")

    model = GAE(GCNEncoder(x.size(1), args.out_channels), gen)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler("cpu", enabled=use_amp)

    def embed():
        model.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16, enabled=use_amp):
            return model.encode(x, train_ei, num_nodes)

    t0 = time.time()
    for epoch in range(1, args.epochs + 1):
        model.train()
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16, enabled=use_amp):
            z = model.encode(x, train_ei, num_nodes)
            loss = model.recon_loss(z, train_pos)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        auc = model.test(embed(), val_pos, val_neg)
        print(f"Epoch: {epoch:03d}, Loss: {loss.item():.4f}, Val AUC: {auc:.4f}", flush=True)
    print(f"Test AUC: {model.test(embed(), test_pos, test_neg):.4f} ({time.time() - t0:.1f}s)")


if __name__ == "__main__":
    main()
