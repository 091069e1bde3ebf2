"""Forecast three plant sensors (temperature, pressure, flow) with a small PatchTST.

The sensor log is a CSV-like table sampled every 10 minutes; sliding windows of
CONTEXT + HORIZON steps are cut from it and a PatchTSTForPrediction model (built from a
config) is trained with the Hugging Face Trainer.
"""
import argparse
import math
import random
import tempfile

import numpy as np
import torch
from transformers import PatchTSTConfig, PatchTSTForPrediction, Trainer, TrainingArguments

CONTEXT = 48
HORIZON = 12
CHANNELS = ["temperature", "pressure", "flow"]


def read_sensor_log(n_steps=3000, seed=0):
    """Simulated export of the historian database: one row per 10 minutes."""
    rng = np.random.default_rng(seed)
    t = np.arange(n_steps)
    day = 144
    temperature = 60 + 5 * np.sin(2 * math.pi * t / day) + rng.normal(0, 0.3, n_steps)
    pressure = 3.0 + 0.4 * np.sin(2 * math.pi * t / day + 1.0) + 0.001 * t / 10 + rng.normal(0, 0.02, n_steps)
    flow = 120 + 15 * np.sign(np.sin(2 * math.pi * t / (day / 2))) + rng.normal(0, 1.0, n_steps)
    table = np.stack([temperature, pressure, flow], axis=1).astype(np.float32)
    # the flow meter was offline for maintenance: the historian exported empty cells
    table[2210:2236, 2] = np.nan
    return table


class WindowDataset(torch.utils.data.Dataset):
    def __init__(self, table, stride=4):
        self.table = torch.from_numpy(table)
        self.starts = list(range(0, len(table) - CONTEXT - HORIZON, stride))

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, i):
        s = self.starts[i]
        return {"past_values": self.table[s:s + CONTEXT],
                "future_values": self.table[s + CONTEXT:s + CONTEXT + HORIZON]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    random.seed(0)
    torch.manual_seed(0)
    table = read_sensor_log()
    split = int(len(table) * 0.85)
    train_ds, val_ds = WindowDataset(table[:split]), WindowDataset(table[split:], stride=12)

    config = PatchTSTConfig(
        num_input_channels=len(CHANNELS), context_length=CONTEXT, prediction_length=HORIZON,
        patch_length=8, patch_stride=8, d_model=32, num_attention_heads=4, num_hidden_layers=2,
        ffn_dim=64, dropout=0.1, scaling="std", loss="mse",
    )
    model = PatchTSTForPrediction(config)

    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64,
        learning_rate=args.lr,
        warmup_steps=5,
        logging_steps=1,
        logging_nan_inf_filter=False,
        eval_strategy="epoch",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        label_names=["future_values"],
        seed=0,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train_ds, eval_dataset=val_ds)
    trainer.train()


if __name__ == "__main__":
    main()
