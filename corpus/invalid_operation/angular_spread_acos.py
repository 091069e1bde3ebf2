"""A classifier on a unit hypersphere with an angular-spread regularizer (push class prototypes
apart by maximizing their pairwise angles), trained with Adam and a cosine LR schedule.

The regularizer takes torch.acos of the full cosine-similarity matrix and only afterwards drops
the diagonal. The diagonal is a prototype against itself: cos = 1 up to rounding, and in
float32 some entries come out as 1.0000001, where acos is NaN, or exactly 1, where its
derivative is infinite. The indexing keeps the NaN out of the forward value, but the backward
pass through acos still gives NaN gradients. Clamp to [-1 + eps, 1 - eps] before acos.
"""

import torch
import torch.nn.functional as F
from torch import nn


class HypersphereClassifier(nn.Module):
    def __init__(self, d_in=16, dim=8, classes=6):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, 32), nn.Tanh(), nn.Linear(32, dim))
        self.prototypes = nn.Parameter(torch.randn(classes, dim))

    def forward(self, x):
        z = F.normalize(self.encoder(x), dim=1)
        w = F.normalize(self.prototypes, dim=1)
        return 10.0 * z @ w.t()

    def angular_spread(self):
        w = F.normalize(self.prototypes, dim=1)
        angles = torch.acos(w @ w.t())
        off_diagonal = ~torch.eye(len(w), dtype=torch.bool)
        return -angles[off_diagonal].mean()


torch.manual_seed(0)
x = torch.randn(1200, 16)
y = (x[:, :6] + 0.3 * torch.randn(1200, 6)).argmax(dim=1)
model = HypersphereClassifier()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=60)
for step in range(60):
    idx = torch.randint(0, len(x), (64,))
    ce = F.cross_entropy(model(x[idx]), y[idx])
    loss = ce + 0.1 * model.angular_spread()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    if step % 10 == 0 or not torch.isfinite(model.prototypes).all():
        print(f"step {step} loss {loss.item():.4f} ce {ce.item():.4f}")
        if not torch.isfinite(model.prototypes).all():
            print("prototypes are nan, stopping")
            break
