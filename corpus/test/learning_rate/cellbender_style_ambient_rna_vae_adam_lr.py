"""Ambient-RNA removal for droplet scRNA-seq with a CellBender-style variational model.

The count matrix holds real cells and empty droplets; every droplet also
contains ambient RNA.  An encoder maps each droplet's log counts to a latent
expression code z (Gaussian, reparameterised), a log cell size d and the
probability that the droplet holds a cell; a decoder turns z into gene
expression fractions.  The Poisson rate of a droplet is
p_cell * exp(d) * chi(z) + exp(d_empty) * chi_ambient, and training minimises
the negative ELBO with Adam under a one-cycle learning-rate schedule, clipping
the gradient norm at 10 as CellBender's ClippedAdam does.  Droplets are simulated (four cell types, log-normal library
sizes, empty droplets with a pure ambient profile).

Reported in https://github.com/broadinstitute/CellBender/issues/52 ("Cellbender
V2 always hits NaN loss, crashes").  The maintainer's advice: "my only real
suggestion as of right now would be to reduce the learning rate. Try reducing
by a factor of 2 or a factor of 5", confirmed by another user ("dropping the
learning rate ... solved the issue").  Here the --learning-rate default is too
large for this model: training is fine while the one-cycle schedule warms up,
but once the rate approaches its peak the Adam steps (each weight moves by about
the learning rate, whatever the gradient norm, so the clipping does not help)
push the predicted log cell size of the large droplets far above its data
range, exp() of it overflows and the Poisson rate and the loss become inf and
then nan.

Fix: lower the learning rate, e.g. --learning-rate 0.03 (a factor of 5).
"""
import argparse
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def simulate_droplets(n_cells, n_empties, n_genes, n_types, seed):
    rng = np.random.RandomState(seed)
    base = rng.gamma(0.6, 1.0, n_genes)
    profiles = np.stack([base * rng.lognormal(0, 1.0, n_genes) for _ in range(n_types)])
    profiles /= profiles.sum(1, keepdims=True)
    cell_type = rng.randint(0, n_types, n_cells)
    ambient = profiles[cell_type].mean(0)
    rate = np.zeros((n_cells + n_empties, n_genes))
    rate[:n_cells] = rng.lognormal(np.log(3000), 0.4, n_cells)[:, None] * profiles[cell_type]
    rate += rng.lognormal(np.log(60), 0.3, n_cells + n_empties)[:, None] * ambient[None]
    counts = rng.poisson(rate).astype(np.float32)
    is_cell = np.r_[np.ones(n_cells), np.zeros(n_empties)].astype(np.float32)
    return torch.from_numpy(counts), torch.from_numpy(is_cell)


class EncodeZ(nn.Module):
    def __init__(self, n_genes, z_dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(n_genes, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.loc_out = nn.Linear(hidden, z_dim)
        self.scale_out = nn.Linear(hidden, z_dim)

    def forward(self, log_counts):
        h = F.softplus(self.fc2(F.softplus(self.fc1(log_counts))))
        return h, self.loc_out(h), torch.exp(self.scale_out(h))


class EncodeNonZ(nn.Module):
    """Cell probability logit and log cell size from the hidden code and the log total."""

    def __init__(self, hidden):
        super().__init__()
        self.d_loc = nn.Linear(hidden + 1, 1)
        self.p_logit = nn.Linear(hidden + 1, 1)

    def forward(self, h, log_total):
        hd = torch.cat([h, log_total], dim=1)
        return self.d_loc(hd).squeeze(1), self.p_logit(hd).squeeze(1)


class Decoder(nn.Module):
    def __init__(self, n_genes, z_dim, hidden):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(z_dim, hidden), nn.Softplus(), nn.Linear(hidden, n_genes))

    def forward(self, z):
        return F.softmax(self.net(z), dim=-1)


class RemoveBackgroundModel(nn.Module):
    def __init__(self, n_genes, z_dim, hidden, empty_log_size, prior_cell_prob):
        super().__init__()
        self.encoder_z = EncodeZ(n_genes, z_dim, hidden)
        self.encoder_other = EncodeNonZ(hidden)
        self.decoder = Decoder(n_genes, z_dim, hidden)
        self.ambient_logit = nn.Parameter(torch.zeros(n_genes))
        self.d_empty_loc = nn.Parameter(torch.tensor(float(empty_log_size)))
        self.prior_cell_prob = prior_cell_prob

    def neg_elbo(self, counts):
        log_total = torch.log1p(counts.sum(1, keepdim=True))
        h, z_loc, z_scale = self.encoder_z(torch.log1p(counts))
        d_loc, p_logit = self.encoder_other(h, log_total)
        z = z_loc + z_scale * torch.randn_like(z_loc)
        chi = self.decoder(z)
        chi_ambient = F.softmax(self.ambient_logit, dim=0)
        p_cell = torch.sigmoid(p_logit)
        rate = p_cell[:, None] * torch.exp(d_loc)[:, None] * chi + torch.exp(self.d_empty_loc) * chi_ambient[None]
        log_lik = (counts * torch.log(rate) - rate - torch.lgamma(counts + 1)).sum(1)
        kl_z = 0.5 * (z_loc ** 2 + z_scale ** 2 - 1 - 2 * torch.log(z_scale)).sum(1)
        q = self.prior_cell_prob
        kl_p = (p_cell * torch.log(p_cell / q + 1e-10)
                + (1 - p_cell) * torch.log((1 - p_cell) / (1 - q) + 1e-10))
        return (-log_lik + kl_z + kl_p).mean(), p_cell


def run_inference(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    counts, is_cell = simulate_droplets(args.expected_cells, args.total_droplets - args.expected_cells,
                                        args.n_genes, 4, args.seed)
    loader = DataLoader(TensorDataset(counts, is_cell), batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = RemoveBackgroundModel(args.n_genes, args.z_dim, args.z_layers, np.log(60.0),
                                  args.expected_cells / args.total_droplets)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.learning_rate,
                                                    epochs=args.epochs, steps_per_epoch=len(loader))

    start = time.time()
    iteration = 0
    for epoch in range(1, args.epochs + 1):
        total, n_batches, correct = 0.0, 0, 0.0
        for batch_counts, batch_is_cell in loader:
            loss, p_cell = model.neg_elbo(batch_counts)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
            optimizer.step()
            scheduler.step()
            if iteration % 10 == 0:
                print(f"[epoch {epoch:03d}] iteration {iteration:3d}  loss: {loss.item():.2f}  "
                      f"lr: {scheduler.get_last_lr()[0]:.4f}")
            total += loss.item()
            correct += ((p_cell.detach() > 0.5).float() == batch_is_cell).float().mean().item()
            n_batches += 1
            iteration += 1
        if epoch % 10 == 0:
            print(f"[epoch {epoch:03d}]  average training loss: {total / n_batches:.4f}  "
                  f"cell calls correct: {correct / n_batches:.3f}")
    print(f"Inference procedure complete in {time.time() - start:.1f} s")


def get_args():
    parser = argparse.ArgumentParser(description="Remove ambient RNA from a droplet count matrix.")
    parser.add_argument("--expected-cells", type=int, default=320, help="Number of cells expected in the dataset.")
    parser.add_argument("--total-droplets-included", dest="total_droplets", type=int, default=960,
                        help="Number of droplets (cells + empties) used for inference.")
    parser.add_argument("--n-genes", type=int, default=150)
    parser.add_argument("--z-dim", type=int, default=20, help="Dimension of the latent gene expression space.")
    parser.add_argument("--z-layers", type=int, default=100, help="Width of the hidden layers of the encoder.")
    parser.add_argument("--epochs", type=int, default=60, help="Number of epochs to train.")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--learning-rate", "-lr", type=float, default=0.15, dest="learning_rate", help="Maximum (one-cycle) learning rate.")
    parser.add_argument("--clip-norm", type=float, default=10.0, help="Gradient norm clipping (ClippedAdam).")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


if __name__ == "__main__":
    run_inference(get_args())
