"""Sparse click-through-rate model: adaptive-lasso logistic regression over
one-hot encoded ad/user fields, warm-started from yesterday's model and
trained with Graves' centred RMSProp.

Bug reproduced: the centred RMSProp ("RMSPropAlex", Graves 2013 eq. 38-41)
normalises by sqrt(n - g**2) and adds epsilon *outside* the square root.
n - g**2 is a variance estimate; for a weight whose gradient is the same
every step it tends to 0 and float32 rounding makes it slightly negative
(-1e-20-ish), so sqrt() returns NaN and the weight becomes NaN.  Here the
one-hot columns of category levels that never occur in the training log get
only the L1 gradient l1 * sign(w), which is constant.

Report: https://github.com/apache/mxnet/pull/6235 ("Fix RMSProp update rule":
"I got NaN because state_n - state_g * state_g can sometimes be something
like -1e-20 ... after I applied this patch, it stops update network weights
to NaN").
Fix (merged): put epsilon under the square root, as in Graves' paper:
    delta = momentum * delta - lr * grad / sqrt(n - g*g + eps)
"""
import os
import tempfile
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import Optimizer

torch.manual_seed(0)
np.random.seed(0)

# ----------------------------------------------------------------------------
# optimizer (port of the centred RMSProp from the old mxnet rmspropalex_update)
# ----------------------------------------------------------------------------
class RMSPropAlex(Optimizer):
    def __init__(self, params, lr=1e-4, gamma1=0.95, gamma2=0.9, epsilon=1e-4):
        defaults = dict(lr=lr, gamma1=gamma1, gamma2=gamma2, epsilon=epsilon)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, g1, g2, eps = group["lr"], group["gamma1"], group["gamma2"], group["epsilon"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                st = self.state[p]
                if not st:
                    st["n"] = torch.zeros_like(p)
                    st["g"] = torch.zeros_like(p)
                    st["delta"] = torch.zeros_like(p)
                n, g, delta = st["n"], st["g"], st["delta"]
                n.mul_(g1).addcmul_(grad, grad, value=1 - g1)
                g.mul_(g1).add_(grad, alpha=1 - g1)
                denom = (n - g * g).sqrt() + eps
                delta.mul_(g2).addcdiv_(grad, denom, value=-lr)
                p.add_(delta)


# ----------------------------------------------------------------------------
# synthetic impression log
# ----------------------------------------------------------------------------
FIELDS = {             # field -> full list of levels from the schema
    "site": 30, "ad_category": 20, "device": 8, "hour": 24, "region": 25, "os": 6,
}
N_ROWS = 6000

def make_log(n):
    cols, logit = {}, np.full(n, -1.2)
    for f, k in FIELDS.items():
        # only the first ~2/3 of the levels show up in this week's log
        seen = max(2, int(k * 0.66))
        p = np.random.dirichlet(np.ones(seen))
        lv = np.random.choice(seen, size=n, p=p)
        eff = np.random.randn(k) * 0.6
        logit += eff[lv]
        cols[f] = lv
    y = (np.random.rand(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return cols, y

def one_hot(cols):
    blocks = []
    for f, k in FIELDS.items():
        b = np.zeros((len(cols[f]), k), dtype=np.float32)
        b[np.arange(len(cols[f])), cols[f]] = 1.0
        blocks.append(b)
    return np.concatenate(blocks, axis=1)

cols, y = make_log(N_ROWS)
X = torch.from_numpy(one_hot(cols))
Y = torch.from_numpy(y)
n_train = 5000
Xtr, Ytr, Xva, Yva = X[:n_train], Y[:n_train], X[n_train:], Y[n_train:]
D = X.shape[1]
print(f"rows={N_ROWS} features={D} ctr={Y.mean():.3f} "
      f"empty columns={(Xtr.sum(0) == 0).sum().item()}")

# ----------------------------------------------------------------------------
# warm start from yesterday's model (daily retraining); the adaptive-lasso
# penalty weights come from the same estimate: lam_j = L1 / |w_prev_j|
ckpt = os.path.join(tempfile.mkdtemp(), "ctr_lr_yesterday.npz")
np.savez(ckpt, weight=(np.random.randn(1, D) * 0.5).astype(np.float32),
         bias=np.array([-1.0], dtype=np.float32))
prev = np.load(ckpt)
model = nn.Linear(D, 1)
with torch.no_grad():
    model.weight.copy_(torch.from_numpy(prev["weight"]))
    model.bias.copy_(torch.from_numpy(prev["bias"]))
L1 = 1e-5
lasso_w = L1 / torch.from_numpy(prev["weight"]).abs().clamp_min(1e-2)
BATCH = 250
EPOCHS = 30
opt = RMSPropAlex(model.parameters(), lr=1e-4, gamma1=0.95, gamma2=0.9, epsilon=1e-4)

step = 0
for epoch in range(EPOCHS):
    perm = torch.randperm(n_train)
    for i in range(0, n_train, BATCH):
        idx = perm[i:i + BATCH]
        logits = model(Xtr[idx]).squeeze(1)
        bce = F.binary_cross_entropy_with_logits(logits, Ytr[idx])
        loss = bce + (lasso_w * model.weight.abs()).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"step {step:4d}  logloss {bce.item():.4f}  total {loss.item():.4f}")
        step += 1
    with torch.no_grad():
        va = F.binary_cross_entropy_with_logits(model(Xva).squeeze(1), Yva).item()
        nz = (model.weight.abs() > 1e-3).sum().item()
    print(f"epoch {epoch:2d}  val logloss {va:.4f}  nonzero weights {nz}")
