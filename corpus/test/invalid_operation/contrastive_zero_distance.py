"""Siamese embedding trained with a contrastive loss on Euclidean distances.

Reported in pytorch/pytorch#2421 ("Gradient of zero norm is nan",
https://github.com/pytorch/pytorch/issues/2421): ``x.norm().backward()`` at x = 0 gives a NaN
gradient, "since that will propagate to make all updates nan".  albanD: the 2-norm contains a
square root whose gradient is +inf at 0, multiplied by 0 in the backward pass -> NaN.

Here the distance is written out by hand, ``torch.sqrt(((a - b) ** 2).sum(1))`` (recent
releases special-case Tensor.norm at 0, a hand-written sqrt is not).  Positive pairs are drawn
with replacement from the same class, so now and then a pair is the same image twice; its
embedding difference is exactly zero, the sqrt's gradient at 0 is inf, inf * 0 = NaN and the
update turns every weight into NaN a few dozen steps in.  Fix (the workaround in the thread):
keep the argument away from 0, ``torch.sqrt(((a - b) ** 2).sum(1) + 1e-12)``.
"""
import torch
import torch.nn as nn
from torch.utils.data import Dataset

torch.manual_seed(0)


class ClusterDataset(Dataset):
    def __init__(self, n_classes=10, per_class=200, dim=32):
        centers = torch.randn(n_classes, dim) * 3
        self.x = centers.repeat_interleave(per_class, 0) + torch.randn(n_classes * per_class, dim)
        self.y = torch.arange(n_classes).repeat_interleave(per_class)
        self.by_class = [torch.nonzero(self.y == c).squeeze(1) for c in range(n_classes)]

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def sample_pairs(self, n):
        a = torch.randint(0, len(self.y), (n,))
        same = torch.rand(n) < 0.25
        b = torch.randint(0, len(self.y), (n,))
        for k in torch.nonzero(same).squeeze(1).tolist():
            pool = self.by_class[int(self.y[a[k]])]
            b[k] = pool[torch.randint(0, len(pool), (1,))]
        return a, b, (self.y[a] == self.y[b]).float()


def contrastive_loss(ea, eb, label, margin=2.0):
    dist = torch.sqrt(((ea - eb) ** 2).sum(dim=1))
    return (label * dist.pow(2) + (1 - label) * torch.relu(margin - dist).pow(2)).mean()


ds = ClusterDataset()
net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

for step in range(300):
    a, b, label = ds.sample_pairs(16)
    loss = contrastive_loss(net(ds.x[a]), net(ds.x[b]), label)
    opt.zero_grad()
    loss.backward()
    gnorm = torch.norm(torch.stack([p.grad.norm() for p in net.parameters()]))
    opt.step()
    print(f"step {step:3d}  loss {loss.item():.4f}  grad_norm {gnorm.item():.4f}")
    if not torch.isfinite(loss):
        break
