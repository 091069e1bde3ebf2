"""ATAC-seq coverage prediction from DNA sequence with the Hugging Face Trainer.

A tiny BERT encoder (BertForTokenClassification with num_labels=1, built from a
BertConfig) reads a 128-bp window of DNA as integer tokens and predicts the
(log1p) ATAC coverage at every base.  As in AtacWorks, the training loss is
MSE + (1 - Pearson r), with Pearson's r written out by hand per track in a
Trainer.compute_loss override.

The windows come from a female donor, so the few windows on chrY have no reads
at all: their coverage track is constant (all zeros) and the denominator of r,
sqrt(sum((y - mean y)^2)), is exactly 0.  The numerator is 0 as well, so r is
0/0 = NaN for that track, the batch loss is nan and the backward pass writes
NaN into every weight; all later losses / eval losses are nan.

Reproduces: https://github.com/NVIDIA-Genomics-Research/AtacWorks/pull/104
("Preventing NaN output from pearson correlation loss function"), which added an
epsilon to the denominator of the correlation (CorrCoef(..., eps=1e-7)).
"""
import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForTokenClassification, Trainer, TrainingArguments

SEED = 0
WINDOW = 128
BASES = "ACGT"
MOTIF = "GATAAG"
VOCAB = {"[PAD]": 0, "[CLS]": 1, "A": 2, "C": 3, "G": 4, "T": 5, "N": 6}

CONFIG = dict(
    n_windows=720,
    chrom_fraction=[("chr1", 0.30), ("chr2", 0.25), ("chr7", 0.20), ("chrX", 0.245), ("chrY", 0.005)],
    mse_weight=1.0,
    pearson_weight=1.0,
    lr=5e-4,
    epochs=2,
    batch_size=8,
)


def simulate_windows(n, chrom_fraction, rng):
    """Synthetic windows: DNA string + per-base read coverage of a female sample."""
    chroms = [c for c, _ in chrom_fraction]
    probs = [p for _, p in chrom_fraction]
    rows = []
    for _ in range(n):
        chrom = rng.choice(chroms, p=probs)
        seq = list(rng.choice(list(BASES), size=WINDOW))
        signal = np.full(WINDOW, 0.3)
        for _ in range(rng.integers(1, 4)):
            pos = rng.integers(8, WINDOW - 14)
            seq[pos:pos + len(MOTIF)] = list(MOTIF)
            signal += 6.0 * np.exp(-0.5 * ((np.arange(WINDOW) - pos - 3) / 6.0) ** 2)
        reads = rng.poisson(signal).astype(np.float32)
        if chrom == "chrY":          # no Y chromosome in this donor: no reads at all
            reads[:] = 0.0
        rows.append({"chrom": chrom, "seq": "".join(seq), "reads": reads})
    return rows


class CoverageDataset(Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        r = self.rows[i]
        ids = torch.tensor([VOCAB[b] for b in r["seq"]], dtype=torch.long)
        return {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "coverage": torch.log1p(torch.from_numpy(r["reads"])),
        }


def pearson_r(x, y):
    # per-track correlation along the sequence axis
    x = x - x.mean(dim=-1, keepdim=True)
    y = y - y.mean(dim=-1, keepdim=True)
    r = torch.sum(x * y, dim=-1) / (torch.sqrt(torch.sum(x ** 2, dim=-1)) * torch.sqrt(torch.sum(y ** 2, dim=-1)))
    return r


class CoverageTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        coverage = inputs.pop("coverage")
        outputs = model(**inputs)
        pred = outputs.logits.squeeze(-1)
        mse = torch.mean((pred - coverage) ** 2)
        r = pearson_r(pred, coverage)
        loss = CONFIG["mse_weight"] * mse + CONFIG["pearson_weight"] * torch.mean(1.0 - r)
        return (loss, outputs) if return_outputs else loss


def main():
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)

    rows = simulate_windows(CONFIG["n_windows"], CONFIG["chrom_fraction"], rng)
    train_rows, val_rows = rows[:640], rows[640:]
    print("train windows per chrom:",
          {c: sum(r["chrom"] == c for r in train_rows) for c, _ in CONFIG["chrom_fraction"]})

    config = BertConfig(vocab_size=len(VOCAB), hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=128,
                        max_position_embeddings=WINDOW + 8, num_labels=1, pad_token_id=0)
    model = BertForTokenClassification(config)

    args = TrainingArguments(
        output_dir="/tmp/atac_coverage_out",
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        eval_strategy="epoch",
        num_train_epochs=CONFIG["epochs"],
        per_device_train_batch_size=CONFIG["batch_size"],
        per_device_eval_batch_size=16,
        learning_rate=CONFIG["lr"],
        warmup_steps=20,
        logging_steps=5,
        logging_nan_inf_filter=False,
        remove_unused_columns=False,
        label_names=["coverage"],
        disable_tqdm=True,
        seed=SEED,
    )
    trainer = CoverageTrainer(model=model, args=args,
                              train_dataset=CoverageDataset(train_rows),
                              eval_dataset=CoverageDataset(val_rows))
    trainer.train()
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
