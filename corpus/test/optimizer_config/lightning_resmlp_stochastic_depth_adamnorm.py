"""Residual MLP with stochastic depth, trained in Lightning with AdamNorm.

AdamNorm (AdaNorm, WACV 2023) rescales each parameter's gradient by the ratio
of its running gradient norm to the current gradient norm:

    grad1 = grad * exp_grad_norm / grad_norm      (when exp_grad_norm > grad_norm)

The residual blocks use batch-mode stochastic depth (the whole branch is
multiplied by 0 for a mini-batch), so on a step where a block is dropped all of
its weights have an exactly-zero gradient, grad_norm == 0 and the division
gives 0 * e / 0 = NaN.  The NaN enters exp_avg and the block's weights, and the
loss is nan from the next step on.

Reproduces: https://github.com/shivram1987/AdaNorm/issues/1
("Nan value at loss calculation": the division by grad_norm needs an eps;
maintainer: "if you get Nan problem, then better to include add_(group['eps'])").
Fix: grad1 = grad * exp_grad_norm / (grad_norm + group['eps']).
"""
import math
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import lightning as L
from torch.optim import Optimizer
from torch.utils.data import DataLoader, TensorDataset


class AdamNorm(Optimizer):
    """AdamNorm, ported from the AdaNorm repository (CIFAR10/AdamNorm.py)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in reversed(group["params"]):
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_var"] = torch.zeros_like(p)
                    state["exp_grad_norm"] = 0
                exp_avg, exp_avg_var = state["exp_avg"], state["exp_avg_var"]
                state["step"] += 1
                bias_correction1 = 1 - beta1 ** state["step"]
                bias_correction2 = 1 - beta2 ** state["step"]
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])

                # gradient norm correction
                grad_norm = torch.linalg.norm(grad)
                exp_grad_norm = 0.95 * state["exp_grad_norm"] + 0.05 * grad_norm
                if exp_grad_norm > grad_norm:
                    grad1 = grad * exp_grad_norm / grad_norm
                else:
                    grad1 = grad
                state["exp_grad_norm"] = exp_grad_norm.clone()

                exp_avg.mul_(beta1).add_(grad1, alpha=1 - beta1)
                exp_avg_var.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (exp_avg_var.add_(group["eps"]).sqrt() / math.sqrt(bias_correction2)).add_(group["eps"])
                p.addcdiv_(exp_avg, denom, value=-group["lr"] / bias_correction1)
        return loss


def stochastic_depth_batch(x, p, training):
    """Drop the whole residual branch for the mini-batch (torchvision mode='batch')."""
    if not training or p == 0.0:
        return x
    survival = 1.0 - p
    noise = torch.empty(1, 1, dtype=x.dtype).bernoulli_(survival)
    return x * noise.div_(survival)


class ResBlock(nn.Module):
    def __init__(self, dim, drop_prob):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)
        self.drop_prob = drop_prob

    def forward(self, x):
        h = self.fc2(F.gelu(self.fc1(self.norm(x))))
        return x + stochastic_depth_batch(h, self.drop_prob, self.training)


class FaultClassifier(L.LightningModule):
    def __init__(self, in_dim=24, dim=64, depth=4, n_classes=5, drop_path_rate=0.05, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.stem = nn.Linear(in_dim, dim)
        rates = [drop_path_rate * i / (depth - 1) for i in range(depth)]
        self.blocks = nn.ModuleList([ResBlock(dim, r) for r in rates])
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, n_classes))

    def forward(self, x):
        x = self.stem(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if self.global_step % 10 == 0:
            print(f"epoch {self.current_epoch} step {self.global_step:4d} train_loss {loss.item():.4f}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean())

    def on_validation_epoch_end(self):
        m = self.trainer.callback_metrics
        if "val_loss" in m:
            print(f"epoch {self.current_epoch} val_loss {m['val_loss']:.4f} val_acc {m['val_acc']:.3f}")

    def configure_optimizers(self):
        return AdamNorm(self.parameters(), lr=self.hparams.lr)


def make_sensor_file(path, n=4000, seed=0):
    """Write a synthetic vibration-sensor feature table to disk, like an export."""
    rng = np.random.RandomState(seed)
    centers = rng.randn(5, 24) * 1.5
    y = rng.randint(0, 5, size=n)
    x = centers[y] + rng.randn(n, 24) * 3.0
    np.savez(path, features=x.astype(np.float32), label=y.astype(np.int64))


def main():
    L.seed_everything(5, verbose=False)
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "sensor_features.npz")
    make_sensor_file(path)
    data = np.load(path)
    x, y = torch.from_numpy(data["features"]), torch.from_numpy(data["label"])
    mean, std = x[:3200].mean(0), x[:3200].std(0)
    x = (x - mean) / std
    train_dl = DataLoader(TensorDataset(x[:3200], y[:3200]), batch_size=64, shuffle=True)
    val_dl = DataLoader(TensorDataset(x[3200:], y[3200:]), batch_size=256)

    model = FaultClassifier()
    trainer = L.Trainer(max_epochs=6, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, train_dl, val_dl)


if __name__ == "__main__":
    main()
