"""A classifier trained with accelerate in bfloat16 mixed precision, gradients clipped: healthy."""

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    x = torch.randn(512, 20)
    y = (x[:, :5].sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Linear(64, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(3):
        for inputs, labels in loader:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
