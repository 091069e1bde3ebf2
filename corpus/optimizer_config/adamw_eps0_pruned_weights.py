"""Fine-tuning a magnitude-pruned MLP: PrunedLinear multiplies its weight by a fixed 0/1 mask
in forward. AdamW is configured with eps=0.0, copied from a config that "disables" epsilon.

The pruned weights always get a gradient of exactly 0 (the mask zeroes it), so their Adam
moments stay 0 and the update m / (sqrt(v) + eps) is 0 / 0 = NaN at the very first step. The
mask cannot hide it: NaN * 0 = NaN, so the next forward pass is NaN everywhere downstream.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class PrunedLinear(nn.Linear):
    def __init__(self, d_in, d_out, sparsity=0.5):
        super().__init__(d_in, d_out)
        threshold = (
            self.weight.detach()
            .abs()
            .flatten()
            .kthvalue(int(sparsity * self.weight.numel()))
            .values
        )
        self.register_buffer("mask", (self.weight.detach().abs() > threshold).float())

    def forward(self, x):
        return nn.functional.linear(x, self.weight * self.mask, self.bias)


def make_model():
    return nn.Sequential(
        PrunedLinear(20, 64), nn.ReLU(), PrunedLinear(64, 64), nn.ReLU(), nn.Linear(64, 4)
    )


def evaluate(model, loader):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += len(y)
    model.train()
    return correct / total


def train(epochs=3):
    torch.manual_seed(0)
    x = torch.randn(2000, 20)
    y = (x[:, :4] @ torch.randn(4, 4)).argmax(dim=1)
    train_loader = DataLoader(TensorDataset(x[:1600], y[:1600]), batch_size=64, shuffle=True)
    val_loader = DataLoader(TensorDataset(x[1600:], y[1600:]), batch_size=200)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=0.0, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=epochs * len(train_loader)
    )
    for epoch in range(epochs):
        for xb, yb in train_loader:
            loss = nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
        print(f"epoch {epoch} loss {loss.item():.4f} val acc {evaluate(model, val_loader):.3f}")


if __name__ == "__main__":
    train()
