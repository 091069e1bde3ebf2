"""Fine-tuning a model whose parameters were cast to float16, with torch.optim.Adam defaults.

Reported in afiaka87/glide-finetune#5 ("Training on half precision leads to nan values",
https://github.com/afiaka87/glide-finetune/issues/5) and fixed by PR #6: "In half precision,
after the first iteration nan values start appearing regardless of input data or gradients
since the adam optimizer breaks in float16 ... This can be fixed by setting the eps variable
to 1e-4 instead of the default 1e-8."  In float16, eps = 1e-8 rounds to 0, and the squared
gradients of small-gradient parameters underflow (g**2 < 6e-8 -> 0), so the update is
m / (sqrt(0) + 0) = inf (or 0/0 = NaN), which poisons the weights.

The identical run in float32 trains normally.  Fix (the PR): ``Adam(..., eps=1e-4)`` for
fp16 parameters -- or keep float32 master weights (autocast + GradScaler).
"""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class Denoiser(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, 256), nn.SiLU(), nn.Linear(256, 256), nn.SiLU(),
                                 nn.Linear(256, dim))

    def forward(self, x):
        return self.net(x)


def main():
    clean = torch.randn(1024, 64) * 0.5
    noisy = clean + 0.3 * torch.randn_like(clean)
    loader = DataLoader(TensorDataset(noisy.half(), clean.half()), batch_size=32, shuffle=True)

    model = Denoiser().half()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, weight_decay=0.0)
    step = 0
    for epoch in range(2):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 5 == 0 or not torch.isfinite(loss):
                print(f"epoch {epoch} step {step} loss {loss.item():.5f}")
            step += 1
            if step >= 40:
                return


if __name__ == "__main__":
    main()
