"""Training a small energy model under CPU autocast in float16, the way a GPU AMP recipe is
often tried on a laptop first.

The model scores each of 512 atoms of 64 molecules and sums the scores into each molecule's
energy, whose targets are in the thousands. Under autocast the atom layers' matmuls run in
float16, whose largest value is 65504. In the first backward pass the gradient of the atom
layers sums the error of all 64 x 512 atom rows: that sum is far beyond 65504, so it is inf,
and the parameters are NaN after the first update. In float32, or in bfloat16 (float32's
range), the same run trains fine. Fix: autocast with dtype=torch.bfloat16 (or no autocast).
"""

import torch
from torch import nn


class EnergyModel(nn.Module):
    def __init__(self, features=16):
        super().__init__()
        self.atom = nn.Sequential(nn.Linear(features, 64), nn.SiLU(), nn.Linear(64, 1))
        self.pool = nn.Linear(512, 1, bias=False)  # sums the atoms' scores
        nn.init.ones_(self.pool.weight)
        self.pool.weight.requires_grad_(False)

    def forward(self, atoms):
        scores = self.atom(atoms).squeeze(-1)  # (batch, 512)
        return self.pool(scores).squeeze(-1)


def main():
    torch.manual_seed(0)
    atoms = torch.randn(64, 512, 16)
    energies = atoms[..., 0].sum(dim=1) * 40.0 + 2000.0  # molecule energies around 2e3-4e3
    model = EnergyModel()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(60):
        with torch.autocast("cpu", dtype=torch.float16):
            predicted = model(atoms)
        loss = nn.functional.mse_loss(predicted.float(), energies)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4g}")


if __name__ == "__main__":
    main()
