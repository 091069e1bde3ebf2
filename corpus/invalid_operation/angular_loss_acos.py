"""Direction regression trained with an angular (arc-cosine) loss.

Reported in pytorch/pytorch#8069 ("About Nan error using acos() function",
https://github.com/pytorch/pytorch/issues/8069): the network uses torch.acos on a cosine and
"encountered a Nan error during its training ... an input value to torch.acos() approaches 1
or -1, causing the grad to diverge".  Clamping to [-1, 1] is not enough: d/dx acos(x) =
-1/sqrt(1 - x^2) is -inf at x = +-1, and once the predicted direction is (numerically) equal
to the target for one sample, the cosine rounds to 1.0 and the backward pass returns NaN.
"Finally I solved this by limiting input from -1 + eps to 1 - eps with eps = 1e-7."

The loss decreases nicely for a while; when the fit gets precise the first sample's cosine
hits 1.0 and every parameter becomes NaN.  Fix: ``cos.clamp(-1 + 1e-7, 1 - 1e-7)`` (or use
atan2 of cross/dot, or 1 - cos as the loss).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class DirectionHead(nn.Module):
    def __init__(self, in_dim=8):
        super().__init__()
        self.proj = nn.Linear(in_dim, 3, bias=False)

    def forward(self, x):
        return F.normalize(self.proj(x), dim=-1)


def angular_loss(pred, target):
    cos = (pred * target).sum(dim=-1)
    cos = torch.clamp(cos, -1.0, 1.0)
    return torch.acos(cos).mean()


def main():
    torch.manual_seed(0)
    w_true = torch.randn(8, 3)
    x = torch.randn(4096, 8)
    target = F.normalize(x @ w_true, dim=-1)

    model = DirectionHead()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(600):
        idx = torch.randint(0, len(x), (128,))
        loss = angular_loss(model(x[idx]), target[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0 or not torch.isfinite(model.proj.weight).all():
            print(f"step {step:4d}  mean angle (rad) {loss.item():.6f}  "
                  f"|W| {model.proj.weight.norm().item():.4f}")
        if not torch.isfinite(model.proj.weight).all():
            break


if __name__ == "__main__":
    main()
