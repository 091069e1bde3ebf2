"""Human-activity recognition from accelerometer windows with a ReLU RNN, ported from an
MXNet symbol/Module script to a LightningModule.

The home-made network (in MXNet an mx.sym graph: a stacked recurrence with ReLU activation
whose outputs are averaged over time and fed to a softmax) was trained with Module.fit's
default optimizer, SGD, here SGD(momentum=0.9).  The port builds the Trainer without any
gradient clipping.

Report: https://github.com/apache/mxnet/issues/8096 ("Mxnet produce 'nan' training error!":
a model built with the mx.sym interface performs well in the first epochs, then training
and validation error become nan.  Answers: "May be gradient explosion", and from an MXNet
maintainer "specify `clip_gradient` in the optimizer also helps sometimes"; the issue was
closed as already holding good suggestions.  The report does not show the architecture;
the recurrent model is this script's choice.)
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl

torch.set_num_threads(1)  # tiny recurrent net: one intra-op thread is faster on CPU

ACTIVITIES = ["walking", "upstairs", "downstairs", "sitting", "standing", "lying"]


def make_windows(n_windows=640, length=40, rate_hz=20.0, seed=0):
    """Tri-axial accelerometer windows; each activity has its own gait frequency,
    amplitude and gravity axis."""
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, len(ACTIVITIES), size=n_windows)
    t = np.arange(length) / rate_hz
    x = np.zeros((n_windows, length, 3), np.float32)
    for i, a in enumerate(labels):
        freq = 0.5 + 0.4 * a + 0.1 * rng.randn()
        amp = 0.5 + 0.15 * a
        for axis in range(3):
            phase = rng.uniform(0, 2 * np.pi)
            gravity = 0.5 if a % 3 == axis else 0.0
            x[i, :, axis] = amp * np.sin(2 * np.pi * freq * t + phase) + gravity \
                + 0.2 * rng.randn(length)
    return torch.from_numpy(x), torch.from_numpy(labels)


class ActivityRNN(pl.LightningModule):
    def __init__(self, num_hidden=48, num_layers=2, learning_rate=0.05, momentum=0.9):
        super().__init__()
        self.save_hyperparameters()
        self.rnn = nn.RNN(3, num_hidden, num_layers=num_layers, nonlinearity="relu",
                          batch_first=True)
        self.fc = nn.Linear(num_hidden, len(ACTIVITIES))

    def forward(self, x):
        outputs, _ = self.rnn(x)
        return self.fc(outputs.mean(dim=1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        if batch_idx % 10 == 0:
            print(f"Epoch[{self.current_epoch}] Batch [{batch_idx}]\t"
                  f"Train-ce={loss.item():.6f}\tTrain-accuracy={acc.item():.4f}")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.learning_rate,
                               momentum=self.hparams.momentum)


def main():
    pl.seed_everything(0)
    x, y = make_windows()
    train_iter = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = ActivityRNN()
    trainer = pl.Trainer(max_epochs=15, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(model, train_iter)


if __name__ == "__main__":
    main()
