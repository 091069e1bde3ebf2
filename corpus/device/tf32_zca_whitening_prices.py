"""Next-minute return prediction from 8 stock prices (~400 each, spread ~2 within a
batch), whitened per batch with ZCA: covariance from one matmul (E[x x^T] - mean mean^T),
eigendecomposition, eigenvalues^-1/2. float32 matmuls are set to "high" precision (TF32).

Needs a CUDA GPU with TF32 (Ampere or newer) to fail; on the CPU it trains normally. The
covariance entries (~4) are small differences of numbers of ~160000. In float32 the matmul
is accurate to about 0.1 and every eigenvalue stays positive; TF32 reads only 10 mantissa
bits of each operand, the entries are off by tens, the matrix is no longer positive definite
and rsqrt of a negative eigenvalue is NaN. Same code, same seed: finite on the CPU, NaN on the
GPU. Keeping float32 matmuls at "highest", or centring before the matmul, fixes it.
"""

import torch
from torch import nn

torch.set_float32_matmul_precision("high")
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def zca_whiten(x):
    mean = x.mean(dim=0)
    cov = x.t() @ x / len(x) - torch.outer(mean, mean)
    evals, evecs = torch.linalg.eigh(cov)
    w = evecs @ torch.diag(evals.rsqrt()) @ evecs.t()
    return (x - mean) @ w


def price_batches(steps, batch=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = 380.0 + 40.0 * torch.rand(8, generator=g)
    for _ in range(steps):
        market = torch.randn(batch, 1, generator=g)
        prices = base + 1.0 * market + 2.0 * torch.randn(batch, 8, generator=g)
        future = 0.3 * (prices - base).mean(dim=1, keepdim=True) + 0.1 * torch.randn(
            batch, 1, generator=g
        )
        yield prices, future


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for step, (prices, future) in enumerate(price_batches(50)):
    prices, future = prices.to(device), future.to(device)
    loss = nn.functional.mse_loss(model(zca_whiten(prices)), future)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0 or not torch.isfinite(loss):
        print(f"step {step} loss {loss.item():.4f}")
