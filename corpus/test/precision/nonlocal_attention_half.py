"""Non-local (self-attention) refinement block trained with the whole model in float16.

Reported in plemeri/InSPyReNet#36 ("Overflow NaN can be happen in training",
https://github.com/plemeri/InSPyReNet/issues/36): "the overflow NaN/Inf can happen when
computing the attention score.  The problem is that query, key in attention layers are not
normalized and the bmm can cause inf during training and inference, especially with mixed
precision, float16."  The author confirmed: with mixed precision "we also ended up with
divergence during training.  This problem should not happen with full precision."

Here the attention logits are ``torch.bmm(q, k.transpose(1, 2))`` over 128 channels with no
scaling, on raw 0..255 image input.  They start around 3e4 and grow as the projections train;
once a positive one passes 65504 it becomes inf in float16, softmax turns the row into NaN and
the loss is nan (iteration ~8).  The float32 version of the same run trains to the end.  Fix: compute the scores in
float32 (``torch.bmm(q.float(), k.float().transpose(1, 2))``) or L2-normalise q and k /
scale by 1/sqrt(C).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
DTYPE = torch.float16


class NonLocal(nn.Module):
    def __init__(self, c=128):
        super().__init__()
        self.q = nn.Conv2d(c, c, 1)
        self.k = nn.Conv2d(c, c, 1)
        self.v = nn.Conv2d(c, c, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q = self.q(x).view(b, c, h * w).transpose(1, 2)
        k = self.k(x).view(b, c, h * w).transpose(1, 2)
        v = self.v(x).view(b, c, h * w).transpose(1, 2)
        attn = torch.bmm(q, k.transpose(1, 2))
        attn = F.softmax(attn, dim=-1)
        out = torch.bmm(attn, v).transpose(1, 2).reshape(b, c, h, w)
        return x + out


class SaliencyHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 128, 3, padding=1), nn.ReLU())
        self.refine = NonLocal(128)
        self.pred = nn.Conv2d(128, 1, 1)

    def forward(self, x):
        return self.pred(self.refine(self.stem(x)))


def batch(gen, n=4):
    img = torch.rand(n, 3, 12, 12, generator=gen) * 255.0
    mask = (img.mean(1, keepdim=True) > 127.5).float()
    return img, mask


model = SaliencyHead().to(DTYPE)
opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
gen = torch.Generator().manual_seed(0)
for it in range(300):
    img, mask = batch(gen)
    logits = model(img.to(DTYPE))
    loss = F.binary_cross_entropy_with_logits(logits.float(), mask)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if it % 10 == 0 or not torch.isfinite(loss):
        with torch.no_grad():
            f = model.stem(img.to(DTYPE))
            q = model.refine.q(f).flatten(2)
            k = model.refine.k(f).flatten(2)
            peak = torch.bmm(q.transpose(1, 2).float(), k.float()).abs().max().item()
        print(f"iter {it:3d}  bce {loss.item():.4f}  max |score| {peak:.0f}")
        if not torch.isfinite(loss):
            break
