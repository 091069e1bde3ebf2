"""Hand-written binary cross-entropy whose clipping epsilon is too small for float32.

Reproduces https://github.com/keras-team/keras/issues/377 ("binary cross-entropy can return nan
because the epsilon is too small"): predictions are clipped to [1e-9, 1 - 1e-9] before taking
logs, but in float32 1 - 1e-9 rounds to exactly 1.0, so the upper clip does nothing.  Once the
classifier becomes confident (sigmoid output rounds to 1.0 for a positive example), the term
(1 - y) * log(1 - p) is 0 * log(0) = 0 * -inf = nan and the loss, then the weights, turn NaN.
Training is healthy for the first few hundred steps.

Fix (what Keras did): use an epsilon that float32 can represent next to 1, i.e. clip to
[1e-7, 1 - 1e-7] (or compute the loss from logits with F.binary_cross_entropy_with_logits).
"""
import torch
import torch.nn as nn

torch.manual_seed(377)

N_TRAIN, N_FEAT, BATCH = 4096, 20, 128
STEPS = 600

# two Gaussian blobs with a clear margin: the classifier gets very confident
w_true = torch.randn(N_FEAT)
x_all = torch.randn(N_TRAIN, N_FEAT)
y_all = (x_all @ w_true > 0).float()
x_all = 2.0 * (x_all + 1.0 * (2 * y_all - 1).unsqueeze(1) * w_true / w_true.norm())


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(N_FEAT, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return torch.sigmoid(self.body(x)).squeeze(1)


def binary_crossentropy(p, y):
    return -(y * torch.log(p.clamp(1e-9, 1 - 1e-9)) + (1 - y) * torch.log(1 - p.clamp(1e-9, 1 - 1e-9))).mean()


model = Classifier()
opt = torch.optim.Adam(model.parameters(), lr=1.5e-3)

for step in range(STEPS):
    idx = torch.randint(0, N_TRAIN, (BATCH,))
    p = model(x_all[idx])
    loss = binary_crossentropy(p, y_all[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        acc = ((p > 0.5).float() == y_all[idx]).float().mean().item()
        print(f"step {step:4d}  loss {loss.item():.6f}  acc {acc:.3f}")
