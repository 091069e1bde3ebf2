"""Train a tiny ViT defect classifier with the HF Trainer, whole model in float16.

The model is cast with ``model.half()`` so weights, gradients and the AdamW moments are all
float16 (no float32 master weights, no loss scaling).  AdamW keeps ``adam_epsilon=1e-8``.
float16 cannot represent 1e-8 (smallest subnormal ~6e-8), so ``sqrt(exp_avg_sq) + eps`` rounds
to ``sqrt(exp_avg_sq)``; and ``(1 - beta2) * grad**2`` underflows to 0 for every gradient entry
below ~5e-3.  For those weights the second moment is exactly 0 while the first moment is not, the
update is ``exp_avg / 0 = inf``, the weights become inf / NaN and every loss after the first
optimizer step is NaN.

Reproduces: https://github.com/pytorch/pytorch/issues/8860 ("NaN loss when using half
precision", Adam on a ``.half()`` CNN); the reporter and a second user fixed it by raising
Adam's eps to 1e-4, a value float16 can represent.

Fix: ``adam_epsilon=1e-4`` (or keep float32 master weights / use fp16 mixed precision).
"""
import argparse

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments, ViTConfig, ViTForImageClassification


class InspectionPatches(Dataset):
    """16x16 grey patches: 0 = clean, 1 = scratch (line), 2 = pit (blob)."""

    def __init__(self, n, seed):
        rng = np.random.default_rng(seed)
        imgs = rng.normal(0.5, 0.08, size=(n, 1, 16, 16)).astype(np.float32)
        labels = rng.integers(0, 3, size=n)
        yy, xx = np.mgrid[0:16, 0:16]
        for i, lab in enumerate(labels):
            if lab == 1:
                r = rng.integers(2, 14)
                if rng.random() < 0.5:
                    imgs[i, 0, r, 2:14] -= 0.35
                else:
                    imgs[i, 0, 2:14, r] -= 0.35
            elif lab == 2:
                cy, cx = rng.integers(3, 13, size=2)
                imgs[i, 0] -= 0.4 * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 3.0)
        self.imgs = (imgs - 0.5) / 0.2
        self.labels = labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {
            "pixel_values": torch.from_numpy(self.imgs[i]).half(),
            "labels": torch.tensor(int(self.labels[i])),
        }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--output-dir", default="/tmp/vit_defects_fp16")
    args = parser.parse_args()

    torch.manual_seed(0)
    np.random.seed(0)

    config = ViTConfig(
        image_size=16, patch_size=4, num_channels=1, hidden_size=48,
        num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
        num_labels=3,
    )
    model = ViTForImageClassification(config)
    model = model.half()  # keep everything in float16 to save memory

    train_ds = InspectionPatches(1024, seed=0)
    eval_ds = InspectionPatches(256, seed=1)

    training_args = TrainingArguments(
        output_dir=args.output_dir,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64,
        learning_rate=args.lr,
        weight_decay=0.01,
        optim="adamw_torch",
        adam_epsilon=1e-8,
        logging_steps=4,
        logging_first_step=True,
        logging_nan_inf_filter=False,
        eval_strategy="epoch",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )

    trainer = Trainer(model=model, args=training_args, train_dataset=train_ds, eval_dataset=eval_ds)
    trainer.train()
    print(trainer.evaluate())


if __name__ == "__main__":
    main()
