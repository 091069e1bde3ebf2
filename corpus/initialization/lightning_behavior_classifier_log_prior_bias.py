"""Per-frame behaviour classifier (Lightning) whose output bias is initialised to the log prior
odds of each behaviour, as done for imbalanced multi-label ethogram data.

Bug: the training labels contain one behaviour ("rear") that was never annotated, so its positive
count is 0 and log(pos / neg) = log(0) = -inf is written into the final Linear bias.  The logit of
that class is -inf for every frame and binary_cross_entropy_with_logits(-inf, 0) evaluates
-inf + inf = NaN, so the very first training loss is NaN and the NaN gradients wipe out every
weight at the first optimizer step.

Report: https://github.com/jbohnslav/deepethogram/issues/15 ("Bias initialized to -inf for class
with no examples", leading to NaN training loss).
Fix (maintainer, commit a956a42): initialise the bias of classes without examples to 0 instead of
log(pos / neg) (e.g. bias = np.where(pos > 0, np.log(pos / neg), 0.0)).
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import lightning as L

BEHAVIORS = ["background", "groom", "walk", "rear", "dig", "sniff"]
N_FEATURES = 48


def make_annotated_frames(n_frames=6000, seed=0):
    rng = np.random.RandomState(seed)
    centers = rng.randn(len(BEHAVIORS), N_FEATURES).astype(np.float32)
    labels = np.zeros((n_frames, len(BEHAVIORS)), dtype=np.float32)
    probs = np.array([0.55, 0.15, 0.12, 0.0, 0.08, 0.10])   # nobody annotated "rear"
    cls = rng.choice(len(BEHAVIORS), size=n_frames, p=probs)
    labels[np.arange(n_frames), cls] = 1.0
    feats = centers[cls] + 1.5 * rng.randn(n_frames, N_FEATURES).astype(np.float32)
    return feats, labels


def init_final_layer_bias(linear_layer, labels):
    pos = labels.sum(axis=0)
    neg = labels.shape[0] - pos
    bias = torch.log(torch.from_numpy(pos / neg)).float()
    linear_layer.bias = nn.Parameter(bias)
    print("custom bias:", linear_layer.bias.data)


class BehaviorClassifier(L.LightningModule):
    def __init__(self, class_counts_source, lr=1e-3, log_every=20):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(N_FEATURES, 128), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.ReLU(),
        )
        self.fc = nn.Linear(64, len(BEHAVIORS))
        init_final_layer_bias(self.fc, class_counts_source)
        self.lr = lr
        self.log_every = log_every

    def forward(self, x):
        return self.fc(self.encoder(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.binary_cross_entropy_with_logits(logits, y)
        if self.global_step % self.log_every == 0:
            print(f"epoch {self.current_epoch} step {self.global_step:4d}  train loss {loss.item():.4f}")
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def main():
    L.seed_everything(0)
    feats, labels = make_annotated_frames()
    ds = TensorDataset(torch.from_numpy(feats), torch.from_numpy(labels))
    loader = DataLoader(ds, batch_size=64, shuffle=True)
    model = BehaviorClassifier(labels)
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()
