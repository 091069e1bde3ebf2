"""ReLU RNN on the adding problem; the gradient-clipping setting never reaches the training loop.

Reported in chentuochao/Sound_Bubble#4 ("Loss could easily be nan during training",
https://github.com/chentuochao/Sound_Bubble/issues/4): "The grad_clip is not passed to model
parameter ... Actually, the model is suffering from gradient exploding and loss will go to
nan after about 2000 iterations."  The config asks for clipping, but the value the training
step reads is None, so backpropagation through long sequences occasionally produces a huge
gradient, one SGD step throws the recurrent weights far away and the loss overflows.

Here an identity-initialised ReLU RNN (IRNN) reads 60-step sequences: the gradient of the
first batch w.r.t. the recurrent matrix is in the hundreds, the unclipped SGD step pushes the
recurrence's spectral radius above 1 and the next forward pass overflows (mse inf).  The
config spells the key ``grad_clip`` while the trainer looks up ``clip_grad_norm``.  Fix: read
the right key so ``torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`` runs before every
optimizer step; with clipping the same run (same lr) stays finite for all 400 steps.
"""
import torch
import torch.nn as nn

CONFIG = {"hidden": 32, "seq_len": 60, "lr": 0.01, "momentum": 0.9, "grad_clip": 1.0, "steps": 400}


def adding_batch(batch, seq_len, gen):
    values = torch.rand(batch, seq_len, generator=gen)
    marks = torch.zeros(batch, seq_len)
    for b in range(batch):
        i, j = torch.randperm(seq_len, generator=gen)[:2]
        marks[b, i] = marks[b, j] = 1.0
    x = torch.stack([values, marks], dim=-1)
    y = (values * marks).sum(dim=1, keepdim=True)
    return x, y


class AddingRNN(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.rnn = nn.RNN(2, hidden, nonlinearity="relu", batch_first=True)
        self.out = nn.Linear(hidden, 1)
        # IRNN initialisation (Le, Jaitly & Hinton 2015): identity recurrence, zero bias
        nn.init.eye_(self.rnn.weight_hh_l0)
        nn.init.zeros_(self.rnn.bias_hh_l0)
        nn.init.normal_(self.rnn.weight_ih_l0, std=0.001)

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.out(h[:, -1])


def train(cfg):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = AddingRNN(cfg["hidden"])
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    max_norm = cfg.get("clip_grad_norm")
    for step in range(cfg["steps"]):
        x, y = adding_batch(32, cfg["seq_len"], gen)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        if step % 10 == 0 or not torch.isfinite(loss):
            print(f"step {step:4d}  mse {loss.item():.4f}")
            if not torch.isfinite(loss):
                break


if __name__ == "__main__":
    train(CONFIG)
