"""Mini OpenFold-style pair-representation trainer under fp16 autocast (AMP).

Bug reproduced (precision): OuterProductMean (AlphaFold2 Algorithm 10) forms, for
every residue pair (i, j), the outer product of two projections of the MSA
embedding and SUMS it over all N_seq sequences of the MSA; the division by the
number of sequences (`outer / norm`) only comes after linear_out.  Under fp16
autocast the einsum runs in half precision, so for a protein with a deep, well
conserved MSA (thousands of nearly identical rows) the un-normalised sum exceeds
the fp16 maximum 65504 and is stored as inf (fp32 value ~7.5e4 here).  linear_out
turns inf into inf/nan for the whole pair row, the pair LayerNorm spreads the nan
and the distogram loss is nan for every deep-MSA protein (steps 2 and 6 below);
the GradScaler just skips those steps and keeps halving the loss scale, so those
proteins never contribute to training.

Report: https://github.com/aqlaboratory/openfold/pull/222
  ("In AMP fp16 mode, overflow issues were observed in several places in the
  network.  To address this, those regions are now converted back to fp32.")

Fix (maintainers, commit aef97f4 "convert suspicious fp16 regions back to fp32"):
OuterProductMean.forward (and a few other regions) is run under
`torch.cuda.amp.autocast(enabled=False)` on `m.float()` whenever the autocast
dtype is float16, i.e. the outer-product sum, linear_out and the division by
norm are computed in float32.  On the CPU: in OuterProductMean.forward, if
autocast is on with float16, run the body inside
`torch.autocast("cpu", enabled=False)` with `m.float()`.
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

config = {
    "model": {
        "c_m": 32,
        "c_z": 16,
        "c_hidden_opm": 8,
        "no_bins": 16,
        "msa_vocab": 23,      # 20 aa + X + gap + mask token
    },
    "data": {
        "n_res": 8,
        # MSA depth per training protein (shallow families and one huge family).
        # The crop and c_hidden are tiny so that this runs on a CPU; the deep
        # MSA keeps the per-pair sum at the size a 256-residue crop with
        # c_hidden 32 and a 5120-sequence extra MSA reaches.
        "msa_depths": [512, 2048, 16384, 4096],
        "mutation_rate": 0.05,
        "batch_size": 1,
    },
    "train": {
        "steps": 8,
        "lr": 1e-3,
        "precision": torch.float16,   # AMP "16"
        "seed": 42,
    },
}


class Linear(nn.Linear):
    """OpenFold-style Linear with named initialisers."""

    def __init__(self, in_dim, out_dim, bias=True, init="default"):
        super().__init__(in_dim, out_dim, bias=bias)
        if bias:
            nn.init.zeros_(self.bias)
        if init == "default":   # LeCun normal
            nn.init.trunc_normal_(self.weight, std=math.sqrt(1.0 / in_dim))
        elif init == "relu":
            nn.init.kaiming_normal_(self.weight, nonlinearity="relu")
        elif init == "final":
            nn.init.normal_(self.weight, std=0.01)


class OuterProductMean(nn.Module):
    """Implements Algorithm 10."""

    def __init__(self, c_m, c_z, c_hidden, eps=1e-3):
        super().__init__()
        self.eps = eps
        self.layer_norm = nn.LayerNorm(c_m)
        self.linear_1 = Linear(c_m, c_hidden)
        self.linear_2 = Linear(c_m, c_hidden)
        self.linear_out = Linear(c_hidden ** 2, c_z, init="final")

    def forward(self, m, mask):
        # m: [*, N_seq, N_res, C_m], mask: [*, N_seq, N_res]
        ln = self.layer_norm(m)
        mask = mask.unsqueeze(-1)
        a = self.linear_1(ln) * mask
        b = self.linear_2(ln) * mask
        a = a.transpose(-2, -3)   # [*, N_res, N_seq, C]
        b = b.transpose(-2, -3)
        # [*, N_res, N_res, C, C]: summed over the N_seq sequences
        outer = torch.einsum("...bac,...dae->...bdce", a, b)
        outer = self.linear_out(outer.reshape(outer.shape[:-2] + (-1,)))
        # [*, N_res, N_res, 1]
        norm = torch.einsum("...abc,...adc->...bdc", mask, mask) + self.eps
        return outer / norm


class PairTransition(nn.Module):
    def __init__(self, c_z, n=2):
        super().__init__()
        self.layer_norm = nn.LayerNorm(c_z)
        self.linear_1 = Linear(c_z, n * c_z, init="relu")
        self.linear_2 = Linear(n * c_z, c_z, init="final")

    def forward(self, z):
        return self.linear_2(F.relu(self.linear_1(self.layer_norm(z))))


class DistogramHead(nn.Module):
    def __init__(self, c_z, no_bins):
        super().__init__()
        self.linear = Linear(c_z, no_bins, init="final")

    def forward(self, z):
        logits = self.linear(z)
        return logits + logits.transpose(-2, -3)


class MiniExtraMsaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.msa_emb = nn.Embedding(cfg["msa_vocab"], cfg["c_m"])
        self.tf_emb_i = Linear(21, cfg["c_z"])
        self.tf_emb_j = Linear(21, cfg["c_z"])
        self.opm = OuterProductMean(cfg["c_m"], cfg["c_z"], cfg["c_hidden_opm"])
        self.pair_transition = PairTransition(cfg["c_z"])
        self.layer_norm_z = nn.LayerNorm(cfg["c_z"])
        self.distogram = DistogramHead(cfg["c_z"], cfg["no_bins"])

    def forward(self, batch):
        tf = batch["target_feat"]
        z = self.tf_emb_i(tf)[..., :, None, :] + self.tf_emb_j(tf)[..., None, :, :]
        m = self.msa_emb(batch["extra_msa"])
        z = z + self.opm(m, batch["extra_msa_mask"])
        z = z + self.pair_transition(z)
        return self.distogram(self.layer_norm_z(z))


def distogram_loss(logits, pseudo_beta, no_bins, min_bin=2.3125, max_bin=21.6875):
    boundaries = torch.linspace(min_bin, max_bin, no_bins - 1) ** 2
    dists = ((pseudo_beta[..., :, None, :] - pseudo_beta[..., None, :, :]) ** 2).sum(-1, keepdim=True)
    true_bins = (dists > boundaries).sum(-1)
    return F.cross_entropy(logits.float().reshape(-1, no_bins), true_bins.reshape(-1))


def make_batch(rng, cfg_d, n_seq):
    """Synthetic protein: random-walk C-beta trace + a highly conserved MSA of n_seq rows."""
    n_res = cfg_d["n_res"]
    steps = rng.normal(size=(n_res, 3))
    steps = 3.8 * steps / np.linalg.norm(steps, axis=-1, keepdims=True)
    pseudo_beta = np.cumsum(steps, 0)
    query = rng.integers(0, 20, n_res)
    msa = np.repeat(query[None], n_seq, 0)
    mutate = rng.random((n_seq, n_res)) < cfg_d["mutation_rate"]
    msa[mutate] = rng.integers(0, 22, mutate.sum())
    return {
        "target_feat": torch.from_numpy(np.eye(21, dtype=np.float32)[query])[None],
        "extra_msa": torch.from_numpy(msa)[None],
        "extra_msa_mask": torch.ones(1, n_seq, n_res),
        "pseudo_beta": torch.from_numpy(pseudo_beta.astype(np.float32))[None],
    }


def main():
    seed = config["train"]["seed"]
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    torch.set_num_threads(2)
    model = MiniExtraMsaModel(config["model"])
    opt = torch.optim.Adam(model.parameters(), lr=config["train"]["lr"])
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    batches = [make_batch(rng, config["data"], d) for d in config["data"]["msa_depths"]]
    for step in range(config["train"]["steps"]):
        batch = batches[step % len(batches)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=config["train"]["precision"]):
            logits = model(batch)
            loss = distogram_loss(logits, batch["pseudo_beta"], config["model"]["no_bins"])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        n_seq = batch["extra_msa_mask"].shape[-2]
        print(f"step {step:3d}  n_extra_msa {n_seq:5d}  distogram_loss {loss.item():.4f}"
              f"  loss_scale {scaler.get_scale():.0f}")


if __name__ == "__main__":
    main()
