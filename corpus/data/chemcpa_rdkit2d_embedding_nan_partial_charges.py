"""chemCPA / ComPert on L1000-like perturbation data with a frozen RDKit2D drug embedding.

Setting: as in theislab/chemCPA at the end of 2021.  An embedding notebook computes the 200
descriptastorus "RDKit2D" descriptors for every drug SMILES and stores the table; training
loads it with get_chemical_representation() as a frozen nn.Embedding.  The ComPert
autoencoder (MLP encoder/decoder with BatchNorm, drug_embedding_encoder, logsigm dosers,
cell-line embeddings, drug / covariate adversaries with a gradient penalty, GaussianNLLLoss,
three Adam optimizers) is trained with drugs coded by index.

Bug: RDKit's Gasteiger charges are undefined for atoms it has no parameters for (Se, B) and
diverge for the platinum complex, so MaxAbsPartialCharge, MaxPartialCharge,
MinAbsPartialCharge and MinPartialCharge are NaN or inf for 3 of the 41 drugs.  The notebook
stores the raw descriptor matrix as it is.  Those drugs were given to only a few cells, so
the first 7 batches train normally; the first batch holding one of them (step 8) gets a NaN
drug embedding, NaN in the decoder's BatchNorm statistics and a NaN reconstruction loss, and
the autoencoder update writes NaN into the weights (every later loss is NaN).

Fix (chemCPA PR #63, closing issue #56 "The RDKit embedding ... has some Inf and NaN values,
which triggers immediate early stopping"): in the embedding notebook set every NaN / inf
entry to 0, drop the columns with std <= 0.01 and z-score the remaining columns before
saving the table.

Report: https://github.com/theislab/chemCPA/pull/63
"""
import json
import os
import re
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HPARAMS = {"dim": 64, "autoencoder_width": 128, "autoencoder_depth": 2, "adversary_width": 64,
           "adversary_depth": 2, "reg_adversary": 5.0, "penalty_adversary": 3.0,
           "autoencoder_lr": 1e-3, "adversary_lr": 3e-4, "dosers_lr": 1e-3, "autoencoder_wd": 1e-6,
           "adversary_wd": 1e-4, "dosers_wd": 1e-7, "adversary_steps": 3, "batch_size": 128}
CHARGE_COLS = ["MaxAbsPartialCharge", "MaxPartialCharge", "MinAbsPartialCharge", "MinPartialCharge"]
GASTEIGER = {"C": 2.45, "N": 2.90, "O": 3.41, "S": 2.39, "F": 3.91, "Cl": 2.98, "Br": 2.80, "P": 2.20}


# --------------------------------------------------------------- embeddings/rdkit notebook
class RDKit2DGenerator:
    """Stand-in for descriptastorus MakeGenerator(("RDKit2D",)): [calculated flag] + 200 floats."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.names = ["RDKit2D_calculated"] + CHARGE_COLS + [f"desc_{i}" for i in range(196)]
        self.proj = rng.normal(size=(10, 196)) * rng.uniform(0.2, 30.0, size=196)

    def atoms(self, smiles):
        return re.findall(r"Cl|Br|Se|Pt|[BCNOSFPcnos]", smiles)

    def process(self, smiles):
        atoms = [a.capitalize() for a in self.atoms(smiles)]
        with np.errstate(invalid="ignore", over="ignore"):
            chi = np.array([GASTEIGER.get(a, np.nan) for a in atoms])
            if "Pt" in atoms:          # charge equalisation does not converge for the metal centre
                chi[atoms.index("Pt")] = np.inf
            charges = (chi - np.mean(chi[~np.isinf(chi)])) / 10.0
            charge_desc = [np.abs(charges).max(), charges.max(), np.abs(charges).min(), charges.min()]
        counts = np.array([atoms.count(a) for a in ("C", "N", "O", "S", "F", "Cl", "Br")]
                          + [smiles.count("="), sum(ch.isdigit() for ch in smiles) / 2, len(atoms)], float)
        other = np.log1p(np.abs(counts @ self.proj)) * np.sign(counts @ self.proj) + counts[:3].sum()
        return [True] + charge_desc + list(other)


def build_rdkit_embedding(smiles_list, out_dir):
    generator = RDKit2DGenerator()
    data = [generator.process(smi) for smi in smiles_list]
    embedding = np.array(data, dtype=np.float64)[:, 1:]          # drop RDKit2D_calculated
    fname = os.path.join(out_dir, "rdkit2D_embedding_lincs.tsv")
    with open(fname, "w") as fh:
        fh.write("smiles\t" + "\t".join(generator.names[1:]) + "\n")
        for smi, row in zip(smiles_list, embedding):
            fh.write(smi + "\t" + "\t".join(repr(float(v)) for v in row) + "\n")
    return fname


def get_chemical_representation(smiles, fname):
    with open(fname) as fh:
        next(fh)
        table = {line.split("\t")[0]: [float(v) for v in line.rstrip("\n").split("\t")[1:]] for line in fh}
    emb = torch.tensor([table[s] for s in smiles], dtype=torch.float32)
    return torch.nn.Embedding.from_pretrained(emb, freeze=True)


# --------------------------------------------------------------- data
def make_lincs_like(n_genes=96, n_cell_lines=4, seed=0):
    rng = np.random.default_rng(seed)
    frags = ["CCO", "c1ccccc1", "C(=O)N", "CCN(C)C", "c1ccncc1", "OC(=O)C", "CS(=O)(=O)N", "Clc1ccccc1",
             "C1CCNCC1", "FC(F)F", "c1ccc(Br)cc1", "CC(C)O", "c1cnc2ccccc2n1", "NC(=O)c1ccccc1"]
    smiles = ["CS(C)=O"]                                                      # control (DMSO)
    while len(smiles) < 38:
        s = "".join(rng.choice(frags, size=rng.integers(2, 5)))
        if s not in smiles:
            smiles.append(s)
    rare = ["O=C(O)c1ccc([Se]C)cc1", "OB(O)c1cccc(NC(=O)C)c1", "N[Pt](N)(Cl)Cl"]
    smiles += rare
    basal = rng.normal(size=(n_cell_lines, n_genes))
    effect = rng.normal(scale=0.8, size=(len(smiles), n_genes))
    effect[0] = 0.0
    cells_per_drug = [400] + [int(rng.integers(50, 90)) for _ in range(37)] + [2, 3, 2]
    genes, drug_idx, doses, cov = [], [], [], []
    for d, n in enumerate(cells_per_drug):
        c = rng.integers(0, n_cell_lines, size=n)
        dose = rng.choice([0.1, 1.0, 10.0], size=n) if d else np.ones(n)
        resp = (np.log1p(dose) / np.log1p(10.0))[:, None] * effect[d]
        genes.append(basal[c] + resp + rng.normal(scale=0.3, size=(n, n_genes)))
        drug_idx.append(np.full(n, d)), doses.append(dose), cov.append(c)
    genes = torch.tensor(np.concatenate(genes), dtype=torch.float32)
    return (smiles, genes, torch.tensor(np.concatenate(drug_idx)), torch.tensor(np.concatenate(doses), dtype=torch.float32),
            F.one_hot(torch.tensor(np.concatenate(cov)), n_cell_lines).float())


class SubDataset(torch.utils.data.Dataset):
    def __init__(self, genes, drugs_idx, dosages, covariates):
        self.genes, self.drugs_idx, self.dosages, self.covariates = genes, drugs_idx, dosages, covariates

    def __len__(self):
        return len(self.genes)

    def __getitem__(self, i):
        return self.genes[i], self.drugs_idx[i], self.dosages[i], self.covariates[i]


# --------------------------------------------------------------- model
class MLP(torch.nn.Module):
    def __init__(self, sizes, batch_norm=True):
        super().__init__()
        layers = []
        for s in range(len(sizes) - 1):
            layers += [torch.nn.Linear(sizes[s], sizes[s + 1]),
                       torch.nn.BatchNorm1d(sizes[s + 1]) if batch_norm and s < len(sizes) - 2 else None,
                       torch.nn.ReLU()]
        self.network = torch.nn.Sequential(*[l for l in layers if l is not None][:-1])

    def forward(self, x):
        return self.network(x)


class GeneralizedSigmoid(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.beta = torch.nn.Parameter(torch.ones(1, dim))
        self.bias = torch.nn.Parameter(torch.zeros(1, dim))

    def forward(self, x, idx):
        bias, beta = self.bias[0][idx], self.beta[0][idx]
        return (torch.log1p(x) * beta + bias).sigmoid() - bias.sigmoid()


class ComPert(torch.nn.Module):
    def __init__(self, num_genes, num_drugs, num_cov, hparams, drug_embeddings):
        super().__init__()
        h = self.hparams = hparams
        self.encoder = MLP([num_genes] + [h["autoencoder_width"]] * h["autoencoder_depth"] + [h["dim"]])
        self.decoder = MLP([h["dim"]] + [h["autoencoder_width"]] * h["autoencoder_depth"] + [num_genes * 2])
        self.adversary_drugs = MLP([h["dim"]] + [h["adversary_width"]] * h["adversary_depth"] + [num_drugs])
        self.adversary_covariates = MLP([h["dim"]] + [h["adversary_width"]] * h["adversary_depth"] + [num_cov])
        self.drug_embeddings = drug_embeddings
        self.drug_embedding_encoder = MLP([drug_embeddings.embedding_dim, h["dim"]])
        self.covariates_embeddings = torch.nn.Embedding(num_cov, h["dim"])
        self.dosers = GeneralizedSigmoid(num_drugs)
        self.loss_autoencoder = torch.nn.GaussianNLLLoss()
        self.iteration = 0
        ae_params = (list(self.encoder.parameters()) + list(self.decoder.parameters())
                     + list(self.drug_embedding_encoder.parameters()) + list(self.covariates_embeddings.parameters()))
        self.optimizer_autoencoder = torch.optim.Adam(ae_params, lr=h["autoencoder_lr"], weight_decay=h["autoencoder_wd"])
        self.optimizer_adversaries = torch.optim.Adam(
            list(self.adversary_drugs.parameters()) + list(self.adversary_covariates.parameters()),
            lr=h["adversary_lr"], weight_decay=h["adversary_wd"])
        self.optimizer_dosers = torch.optim.Adam(self.dosers.parameters(), lr=h["dosers_lr"], weight_decay=h["dosers_wd"])

    def predict(self, genes, drugs_idx, dosages, covariates):
        latent_basal = self.encoder(genes)
        scaled = self.dosers(dosages, drugs_idx)
        drug_embedding = torch.einsum("b,be->be", [scaled, self.drug_embeddings.weight[drugs_idx]])
        latent_treated = latent_basal + self.drug_embedding_encoder(drug_embedding)
        latent_treated = latent_treated + self.covariates_embeddings(covariates.argmax(1))
        rec = self.decoder(latent_treated)
        dim = rec.size(1) // 2
        return torch.cat([rec[:, :dim], F.softplus(rec[:, dim:])], dim=1), latent_basal

    def update(self, genes, drugs_idx, dosages, covariates):
        rec, latent_basal = self.predict(genes, drugs_idx, dosages, covariates)
        dim = rec.size(1) // 2
        reconstruction_loss = self.loss_autoencoder(input=rec[:, :dim], target=genes, var=rec[:, dim:])
        adv_drug_pred = self.adversary_drugs(latent_basal)
        adv_cov_pred = self.adversary_covariates(latent_basal)
        adversary_drugs_loss = F.cross_entropy(adv_drug_pred, drugs_idx)
        adversary_covariates_loss = F.cross_entropy(adv_cov_pred, covariates.argmax(1))
        if self.iteration % self.hparams["adversary_steps"] == 0:
            def penalty(output):
                return torch.autograd.grad(output.sum(), latent_basal, create_graph=True)[0].pow(2).mean()
            self.optimizer_adversaries.zero_grad()
            (adversary_drugs_loss + self.hparams["penalty_adversary"] * penalty(adv_drug_pred)
             + adversary_covariates_loss + self.hparams["penalty_adversary"] * penalty(adv_cov_pred)).backward()
            self.optimizer_adversaries.step()
        else:
            self.optimizer_autoencoder.zero_grad()
            self.optimizer_dosers.zero_grad()
            (reconstruction_loss - self.hparams["reg_adversary"] * adversary_drugs_loss
             - self.hparams["reg_adversary"] * adversary_covariates_loss).backward()
            self.optimizer_autoencoder.step()
            self.optimizer_dosers.step()
        self.iteration += 1
        return {"loss_reconstruction": reconstruction_loss.item(), "loss_adv_drugs": adversary_drugs_loss.item(),
                "loss_adv_covariates": adversary_covariates_loss.item()}


def main(num_epochs=3, seed=0):
    torch.manual_seed(seed)
    np.random.seed(seed)
    smiles, genes, drugs_idx, dosages, covariates = make_lincs_like(seed=seed)
    with tempfile.TemporaryDirectory() as embedding_dir:
        fname = build_rdkit_embedding(smiles, embedding_dir)
        drug_embeddings = get_chemical_representation(smiles, fname)
    dataset = SubDataset(genes, drugs_idx, dosages, covariates)
    loader = torch.utils.data.DataLoader(dataset, batch_size=HPARAMS["batch_size"], shuffle=True,
                                         generator=torch.Generator().manual_seed(seed))
    model = ComPert(genes.shape[1], len(smiles), covariates.shape[1], HPARAMS, drug_embeddings)
    print(json.dumps({"num_cells": len(dataset), "num_drugs": len(smiles), "batches": len(loader)}))
    step = 0
    for epoch in range(num_epochs):
        epoch_loss = 0.0
        for genes_b, drugs_b, dose_b, cov_b in loader:
            stats = model.update(genes_b, drugs_b, dose_b, cov_b)
            step += 1
            epoch_loss += stats["loss_reconstruction"]
            if step % 5 == 0 or stats["loss_reconstruction"] != stats["loss_reconstruction"]:
                print(f"step {step:3d}  " + "  ".join(f"{k} {v:.4f}" for k, v in stats.items()))
        print(json.dumps({"epoch": epoch, "loss_reconstruction": epoch_loss / len(loader)}))


if __name__ == "__main__":
    main()
