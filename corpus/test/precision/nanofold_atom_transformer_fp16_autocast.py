"""Nanofold-style (AlphaFold 3 re-implementation) atom-level denoiser: an AtomTransformer
with sequence-local attention (queries in blocks of 8 atoms, keys in windows of 16) is
trained to denoise backbone coordinates of synthetic protein chains, one batch per "epoch",
under torch.autocast with float16 and a GradScaler (the trainer's `use_amp` option).

Reproduces the problem fixed in ogchen/nanofold PR #31 ("Use bfloat16 training to prevent
issues with inf and nan", commit a6b71b6 "Switch to bfloat16 training": the autocast calls
of the Trainer get dtype=torch.bfloat16, the GradScaler is disabled; the follow-up commit
4254dff then restores the AlphaFold 3 attention bias beta = -1e10, which had been lowered to
-1e4 the day before in 1ce56a3 "Fix issue with nan due to softmaxing tensor of -inf").
The local-attention mask is turned into an additive bias beta = -(10**10) * ~mask.  Under
float16 autocast the pair-bias projection is half precision, so bias + beta rounds -1e10 to
-inf.  Chains are cropped / padded to 48 atoms; a short chain (rare in the data) leaves whole
query blocks of padding atoms whose key window holds no real atom: their attention row is
all -inf and softmax gives 0/0 = NaN.  The padded outputs are multiplied by the atom mask in
the loss, but NaN * 0 is still NaN, so the loss is nan on every batch that holds a short
chain (GradScaler skips those steps).  In float32 or bfloat16 -1e10 is finite, such a row is
a harmless uniform softmax and the masked loss stays finite.  Fix (PR #31): autocast with
dtype=torch.bfloat16.
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

PARAMS = {
    "device": "cpu",
    "use_amp": True,
    "seed": 11,
    "num_chains": 160,
    "crop_atoms": 48,
    "atoms_per_residue": 4,
    "batch_size": 4,
    "max_epoch": 160,
    "log_every_n_epoch": 10,
    "learning_rate": 2e-3,
    "beta1": 0.9,
    "beta2": 0.999,
    "optimizer_eps": 1e-8,
    "lr_start_factor": 0.1,
    "lr_warmup": 20,
    "clip_norm": 10.0,
    "atom_embedding_size": 32,
    "atom_pair_embedding_size": 16,
    "num_atom_transformer_blocks": 2,
    "num_atom_transformer_heads": 4,
    "num_atom_transformer_queries": 8,
    "num_atom_transformer_keys": 16,
    "data_std_dev": 16.0,
    "max_relpos": 16,
}


# ------------------------------------------------------------------------------ data
def make_chain(num_residues, rng):
    """Backbone N, CA, C, O coordinates (Angstrom) of a random self-avoiding-ish walk."""
    ca = np.zeros((num_residues, 3))
    direction = rng.normal(size=3)
    direction /= np.linalg.norm(direction)
    for i in range(1, num_residues):
        direction = direction + 0.6 * rng.normal(size=3)
        direction /= np.linalg.norm(direction)
        ca[i] = ca[i - 1] + 3.8 * direction
    offsets = np.array([[-1.2, 0.8, 0.0], [0.0, 0.0, 0.0], [1.3, 0.6, 0.2], [2.1, 1.4, -0.5]])
    coords = ca[:, None, :] + offsets[None] + 0.1 * rng.normal(size=(num_residues, 4, 3))
    return coords.reshape(-1, 3).astype(np.float32)


class ChainDataset(torch.utils.data.Dataset):
    def __init__(self, params):
        rng = np.random.default_rng(params["seed"])
        self.crop = params["crop_atoms"]
        self.apr = params["atoms_per_residue"]
        self.chains = []
        for i in range(params["num_chains"]):
            # most PDB chains are longer than the crop; a few short peptides are not
            n_res = int(rng.integers(18, 60)) if i % 53 != 7 else int(rng.integers(5, 10))
            self.chains.append((make_chain(n_res, rng), rng.integers(0, 20, n_res)))

    def __len__(self):
        return len(self.chains)

    def __getitem__(self, idx):
        coords, restype = self.chains[idx]
        n_atoms = coords.shape[0]
        start = 0
        if n_atoms > self.crop:
            start = self.apr * int(np.random.randint(0, (n_atoms - self.crop) // self.apr + 1))
        coords = coords[start:start + self.crop]
        restype = np.repeat(restype, self.apr)[start:start + self.crop]
        n = coords.shape[0]
        coords = coords - coords.mean(axis=0, keepdims=True)
        out_coords = np.zeros((self.crop, 3), np.float32)
        out_coords[:n] = coords
        atom_mask = np.zeros(self.crop, np.float32)
        atom_mask[:n] = 1.0
        res = np.zeros(self.crop, np.int64)
        res[:n] = restype
        atom_type = np.tile(np.arange(self.apr), self.crop // self.apr)
        return {
            "coords": torch.from_numpy(out_coords),
            "atom_mask": torch.from_numpy(atom_mask),
            "restype": torch.from_numpy(res),
            "atom_type": torch.from_numpy(atom_type),
        }


# ----------------------------------------------------------------------------- model
class AdaLN(nn.Module):
    def __init__(self, a_size, s_size):
        super().__init__()
        self.norm_a = nn.LayerNorm(a_size, elementwise_affine=False)
        self.norm_s = nn.LayerNorm(s_size, bias=False)
        self.scale = nn.Linear(s_size, a_size)
        self.shift = nn.Linear(s_size, a_size, bias=False)

    def forward(self, a, s):
        s = self.norm_s(s)
        return torch.sigmoid(self.scale(s)) * self.norm_a(a) + self.shift(s)


class AttentionPairBias(nn.Module):
    def __init__(self, num_head, a_size, s_size, p_size):
        super().__init__()
        self.num_head = num_head
        self.head_size = a_size // num_head
        self.ada_ln = AdaLN(a_size, s_size)
        self.query = nn.Linear(a_size, a_size)
        self.key = nn.Linear(a_size, a_size, bias=False)
        self.value = nn.Linear(a_size, a_size, bias=False)
        self.bias = nn.Sequential(nn.LayerNorm(p_size), nn.Linear(p_size, num_head, bias=False))
        self.gate = nn.Linear(a_size, a_size, bias=False)
        self.projection_a = nn.Linear(a_size, a_size, bias=False)

    def split(self, x):
        return x.view(*x.shape[:-1], self.num_head, self.head_size).transpose(-3, -2)

    def forward(self, a, s, pair_rep, beta):
        a = self.ada_ln(a, s)
        q, k, v = self.split(self.query(a)), self.split(self.key(a)), self.split(self.value(a))
        b = self.bias(pair_rep) + beta.unsqueeze(-1)  # (L, L, H) + (B, L, L, 1)
        logits = q @ k.transpose(-1, -2) / math.sqrt(self.head_size) + b.movedim(-1, -3)
        attention = torch.softmax(logits, dim=-1) @ v
        attention = attention * torch.sigmoid(self.split(self.gate(a)))
        return self.projection_a(attention.transpose(-3, -2).flatten(start_dim=-2))


class ConditionedTransitionBlock(nn.Module):
    def __init__(self, a_size, s_size, n=2):
        super().__init__()
        self.ada_ln = AdaLN(a_size, s_size)
        self.linear_1 = nn.Linear(a_size, n * a_size, bias=False)
        self.linear_2 = nn.Linear(a_size, n * a_size, bias=False)
        self.linear_out = nn.Linear(n * a_size, a_size, bias=False)

    def forward(self, a, s):
        a = self.ada_ln(a, s)
        return self.linear_out(F.silu(self.linear_1(a)) * self.linear_2(a))


class DiffusionTransformer(nn.Module):
    def __init__(self, a_size, s_size, p_size, num_block, num_head):
        super().__init__()
        self.attn = nn.ModuleList([AttentionPairBias(num_head, a_size, s_size, p_size) for _ in range(num_block)])
        self.trans = nn.ModuleList([ConditionedTransitionBlock(a_size, s_size) for _ in range(num_block)])

    def forward(self, a, s, pair_rep, beta):
        for attn, trans in zip(self.attn, self.trans):
            b = attn(a, s, pair_rep, beta)
            a = a + b + trans(a, s)
        return a


class AtomTransformer(nn.Module):
    def __init__(self, q_size, c_size, p_size, num_block, num_head, num_queries, num_keys):
        super().__init__()
        self.num_queries = num_queries
        self.num_keys = num_keys
        self.diffusion_transformer = DiffusionTransformer(q_size, c_size, p_size, num_block, num_head)

    def forward(self, q, c, pair_rep, atom_mask):
        L = q.size(-2)
        centres = torch.arange((self.num_queries - 1) / 2, L, self.num_queries)
        idx = torch.arange(L)
        row_mask = torch.abs(idx.unsqueeze(-1) - centres) < self.num_queries / 2
        col_mask = torch.abs(idx.unsqueeze(-1) - centres) < self.num_keys / 2
        mask = torch.any(row_mask.unsqueeze(-2) & col_mask.unsqueeze(-3), dim=-1)  # (L, L)
        mask = mask & atom_mask.bool().unsqueeze(-2)  # padding atoms are never keys
        beta = -(10**10) * ~mask
        return self.diffusion_transformer(q, c, pair_rep, beta)


class AtomDenoiser(nn.Module):
    """Atom attention encoder/decoder of the diffusion module, without the token trunk."""

    def __init__(self, params):
        super().__init__()
        a, p = params["atom_embedding_size"], params["atom_pair_embedding_size"]
        self.sigma_data = params["data_std_dev"]
        self.max_relpos = params["max_relpos"]
        self.restype_emb = nn.Embedding(20, a)
        self.atom_type_emb = nn.Embedding(params["atoms_per_residue"], a)
        self.noise_emb = nn.Linear(1, a)
        self.pos_proj = nn.Linear(3, a, bias=False)
        self.relpos_emb = nn.Embedding(2 * self.max_relpos + 1, p)
        self.atom_transformer = AtomTransformer(
            a, a, p,
            params["num_atom_transformer_blocks"],
            params["num_atom_transformer_heads"],
            params["num_atom_transformer_queries"],
            params["num_atom_transformer_keys"],
        )
        self.out = nn.Sequential(nn.LayerNorm(a), nn.Linear(a, 3, bias=False))

    def forward(self, x_noisy, t, batch):
        sd = self.sigma_data
        c = self.restype_emb(batch["restype"]) + self.atom_type_emb(batch["atom_type"])
        c = c + self.noise_emb(torch.log(t / sd).view(-1, 1, 1) / 4)
        r = x_noisy / torch.sqrt(t**2 + sd**2).view(-1, 1, 1)
        q = c + self.pos_proj(r)
        L = q.size(-2)
        rel = torch.arange(L).unsqueeze(0) - torch.arange(L).unsqueeze(1)
        pair_rep = self.relpos_emb(rel.clamp(-self.max_relpos, self.max_relpos) + self.max_relpos)
        q = self.atom_transformer(q, c, pair_rep, batch["atom_mask"])
        r_update = self.out(q)
        t = t.view(-1, 1, 1)
        return x_noisy * sd**2 / (sd**2 + t**2) + r_update * sd * t / torch.sqrt(sd**2 + t**2)

    def loss(self, batch):
        x = batch["coords"]
        mask = batch["atom_mask"]
        t = self.sigma_data * torch.exp(-1.2 + 1.5 * torch.randn(x.size(0)))
        x_noisy = x + t.view(-1, 1, 1) * torch.randn_like(x)
        x_out = self.forward(x_noisy, t, batch)
        weight = (t**2 + self.sigma_data**2) / (t * self.sigma_data) ** 2
        se = ((x_out - x) ** 2).sum(-1) * mask
        mse = se.sum(-1) / (3 * mask.sum(-1))
        return (weight * mse).mean() / 10.0


# --------------------------------------------------------------------------- trainer
class Trainer:
    def __init__(self, params):
        self.params = params
        self.model = AtomDenoiser(params).to(params["device"])
        self.optimizer = torch.optim.Adam(
            self.model.parameters(),
            lr=params["learning_rate"],
            betas=(params["beta1"], params["beta2"]),
            eps=params["optimizer_eps"],
        )
        self.scheduler = torch.optim.lr_scheduler.LinearLR(
            self.optimizer, start_factor=params["lr_start_factor"], total_iters=params["lr_warmup"]
        )
        self.scaler = torch.amp.GradScaler(params["device"], enabled=params["use_amp"])
        self.epoch = 0

    def training_loop(self, batch):
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.params["device"], dtype=torch.float16, enabled=self.params["use_amp"]):
            loss = self.model.loss(batch)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.params["clip_norm"])
        self.scaler.step(self.optimizer)
        current_scale = self.scaler.get_scale()
        self.scaler.update()
        if current_scale <= self.scaler.get_scale():
            self.scheduler.step()
        return loss.item()

    def fit(self, train_loader):
        losses = []
        while self.epoch < self.params["max_epoch"]:
            batch = next(iter(train_loader))
            loss = self.training_loop(batch)
            losses.append(loss)
            if not math.isfinite(loss) or self.epoch % self.params["log_every_n_epoch"] == 0:
                recent = [v for v in losses[-10:] if math.isfinite(v)]
                print(f"epoch {self.epoch:4d}  loss {loss:.4f}  "
                      f"(finite mean of last 10: {np.mean(recent) if recent else float('nan'):.4f}, "
                      f"scale {self.scaler.get_scale():.0f})")
            self.epoch += 1
        return losses


def main():
    torch.set_num_threads(1)  # tiny model: one intra-op thread is faster on CPU
    torch.manual_seed(PARAMS["seed"])
    np.random.seed(PARAMS["seed"])
    dataset = ChainDataset(PARAMS)
    loader = torch.utils.data.DataLoader(dataset, batch_size=PARAMS["batch_size"], shuffle=True)
    trainer = Trainer(PARAMS)
    losses = trainer.fit(loader)
    bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    print(f"finished: {len(bad)} non-finite losses, first at epoch {bad[0] if bad else None}")


if __name__ == "__main__":
    main()
