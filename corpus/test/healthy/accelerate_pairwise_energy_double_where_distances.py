"""Healthy: a small distance-based interatomic potential trained with accelerate on padded
molecules, on energies and on forces (forces = -dE/dpos via autograd with create_graph=True, so
the loss is differentiated through the distance computation twice).  The pair-distance matrix contains exact zeros (the diagonal, and every pair of padding
atoms, which sit at the origin), and the model takes sqrt of the squared distances and 1/r for a
Coulomb-like term inside torch.where -- the pattern that gives NaN gradients when the masked-out
branch is evaluated on 0 (sqrt'(0) = inf, 1/0 = inf, and inf * 0 = NaN in the where backward).

Here the "double where" workaround from the report is applied: the squared distances are first
replaced by 1.0 where they are zero, so neither sqrt nor the reciprocal ever sees a zero and the
masked branch has finite gradients.  Training is finite throughout; the loss is large at first
(energies are not normalised) and then drops.

Report: https://github.com/pytorch/pytorch/issues/52248 ("torch.where leads to unexpected
gradients": the unselected branch's inf/nan gradients leak through torch.where; the workaround is
to sanitise the inputs of the unsafe branch before applying it).
"""
import math

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, Dataset

MAX_ATOMS = 12
N_SPECIES = 4
CUTOFF = 5.0


class RandomMolecules(Dataset):
    """Random conformers with 5..12 atoms, padded to MAX_ATOMS (padding atoms at the origin)."""

    def __init__(self, n_mols=2048, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.pos = torch.zeros(n_mols, MAX_ATOMS, 3)
        self.species = torch.zeros(n_mols, MAX_ATOMS, dtype=torch.long)
        self.mask = torch.zeros(n_mols, MAX_ATOMS, dtype=torch.bool)
        charges = torch.tensor([0.4, -0.3, 0.1, -0.2])
        self.energy = torch.zeros(n_mols)
        self.forces = torch.zeros(n_mols, MAX_ATOMS, 3)
        for m in range(n_mols):
            n = int(torch.randint(5, MAX_ATOMS + 1, (1,), generator=g))
            # place atoms on a jittered lattice so that no two real atoms overlap
            grid = torch.stack(torch.meshgrid(torch.arange(3.0), torch.arange(3.0), torch.arange(2.0),
                                              indexing="ij"), -1).reshape(-1, 3) * 1.4
            idx = torch.randperm(grid.shape[0], generator=g)[:n]
            self.pos[m, :n] = grid[idx] + 0.15 * torch.randn(n, 3, generator=g)
            self.species[m, :n] = torch.randint(0, N_SPECIES, (n,), generator=g)
            self.mask[m, :n] = True
            p = self.pos[m, :n].clone().requires_grad_(True)
            r = torch.cdist(p, p)
            q = charges[self.species[m, :n]]
            iu = torch.triu_indices(n, n, 1)
            rij = r[iu[0], iu[1]]
            lj = 4.0 * ((0.8 / rij) ** 12 - (0.8 / rij) ** 6)
            e = (lj + 14.4 * q[iu[0]] * q[iu[1]] / rij).sum()
            self.forces[m, :n] = -torch.autograd.grad(e, p)[0]
            self.energy[m] = e.detach()

    def __len__(self):
        return self.pos.shape[0]

    def __getitem__(self, i):
        return self.pos[i], self.species[i], self.mask[i], self.energy[i], self.forces[i]


def safe_pair_distances(pos):
    diff = pos.unsqueeze(2) - pos.unsqueeze(1)
    d2 = (diff ** 2).sum(-1)                       # exact zeros on the diagonal / padding pairs
    nonzero = d2 > 0
    d2_safe = torch.where(nonzero, d2, torch.ones_like(d2))
    dist = torch.where(nonzero, d2_safe.sqrt(), torch.zeros_like(d2))
    inv_dist = torch.where(nonzero, 1.0 / d2_safe.sqrt(), torch.zeros_like(d2))
    return dist, inv_dist


class PairEnergyNet(nn.Module):
    def __init__(self, n_rbf=24, hidden=64):
        super().__init__()
        self.embed = nn.Embedding(N_SPECIES, hidden)
        self.register_buffer("centers", torch.linspace(0.5, CUTOFF, n_rbf))
        self.gamma = 4.0
        self.filter = nn.Sequential(nn.Linear(n_rbf, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.readout = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 1))
        self.charge = nn.Linear(hidden, 1)

    def forward(self, pos, species, mask):
        dist, inv_dist = safe_pair_distances(pos)
        pair_mask = (mask.unsqueeze(1) & mask.unsqueeze(2)) & (dist > 0)
        rbf = torch.exp(-self.gamma * (dist.unsqueeze(-1) - self.centers) ** 2)
        fcut = 0.5 * (torch.cos(math.pi * dist / CUTOFF) + 1.0) * (dist < CUTOFF)
        w = self.filter(rbf) * (fcut * pair_mask).unsqueeze(-1)
        h = self.embed(species)
        h = h + (w * h.unsqueeze(1)).sum(2)
        e_atom = self.readout(h).squeeze(-1) * mask
        q = self.charge(h).squeeze(-1) * mask
        e_coul = 0.5 * 14.4 * (q.unsqueeze(1) * q.unsqueeze(2) * inv_dist * pair_mask).sum((1, 2))
        return e_atom.sum(1) + e_coul


def main():
    set_seed(0)
    accelerator = Accelerator(cpu=True)
    ds = RandomMolecules()
    loader = DataLoader(ds, batch_size=64, shuffle=True)
    model = PairEnergyNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    step = 0
    for epoch in range(6):
        for pos, species, mask, energy, forces in loader:
            pos = pos.requires_grad_(True)
            pred = model(pos, species, mask)
            pred_forces = -torch.autograd.grad(pred.sum(), pos, create_graph=True)[0]
            e_loss = nn.functional.mse_loss(pred, energy)
            f_loss = nn.functional.mse_loss(pred_forces, forces)
            loss = e_loss + 10.0 * f_loss
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            if step % 20 == 0:
                accelerator.print(f"epoch {epoch} step {step:4d}  loss {loss.item():.4f}  "
                                  f"energy mse {e_loss.item():.4f}  force mse {f_loss.item():.4f}")
            step += 1


if __name__ == "__main__":
    main()
