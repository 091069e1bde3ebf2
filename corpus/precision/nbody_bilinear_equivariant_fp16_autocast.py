"""Geometric-algebra-style n-body regressor trained under float16 autocast.

Each block mixes multivector channels with two equivariant linear maps and multiplies them
(a geometric-product-like bilinear layer), so activation magnitudes grow quadratically with the
weights.  The targets (final positions in an un-normalised simulation unit) are large, and as the
network scales its weights up to fit them, the bilinear products in float16 pass 65504 and
overflow to inf; the loss becomes inf/NaN after a few dozen steps.  The same script in float32
or bfloat16 trains fine.

Reproduces: https://github.com/Qualcomm-AI-research/geometric-algebra-transformer/issues/15
Fix (maintainers' answer, confirmed by the reporter): train with bfloat16 instead of float16
(``torch.autocast(..., dtype=torch.bfloat16)``).
"""
import torch
import torch.nn as nn

torch.manual_seed(0)

N_BODIES, CH = 6, 16
AMP_DTYPE = torch.float16


def simulate(num, steps=20, dt=0.01):
    pos = torch.randn(num, N_BODIES, 3) * 7.5
    vel = torch.randn(num, N_BODIES, 3) * 1.875
    mass = torch.rand(num, N_BODIES, 1) * 5 + 1
    start = torch.cat([pos, vel, mass], dim=-1)
    for _ in range(steps):
        diff = pos[:, None, :, :] - pos[:, :, None, :]
        dist3 = (diff.norm(dim=-1, keepdim=True) ** 2 + 25.0) ** 1.5
        acc = (mass[:, None, :, :] * diff / dist3).sum(2) * 100.0
        vel = vel + dt * acc
        pos = pos + dt * vel
    return start, pos


class BilinearBlock(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.left = nn.Linear(ch, ch)
        self.right = nn.Linear(ch, ch)
        self.out = nn.Linear(2 * ch, ch)

    def forward(self, x):
        prod = self.left(x) * self.right(x)
        return x + self.out(torch.cat([x, prod], dim=-1))


class NBodyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(7, CH)
        self.blocks = nn.ModuleList(BilinearBlock(CH) for _ in range(3))
        self.attn_q = nn.Linear(CH, CH)
        self.attn_k = nn.Linear(CH, CH)
        self.head = nn.Linear(CH, 3)

    def forward(self, bodies):
        x = self.embed(bodies)
        for block in self.blocks:
            x = block(x)
            att = torch.softmax(self.attn_q(x) @ self.attn_k(x).transpose(1, 2) / CH ** 0.5, dim=-1)
            x = x + att @ x
        return bodies[..., :3] + self.head(x)


inputs, targets = simulate(2048)
model = NBodyNet()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

for step in range(1, 401):
    idx = torch.randint(0, inputs.shape[0], (64,))
    with torch.autocast("cpu", dtype=AMP_DTYPE):
        pred = model(inputs[idx])
        loss = ((pred.float() - targets[idx]) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step:4d}  mse {loss.item():.4f}")
