"""Multi-task ticket triage: a shared encoder with a category head (always labelled)
and a priority head that is only labelled for a minority of tickets.  Trained with
large batches and LAMB (layer-wise adaptive moments), vendored from pytorch-lamb.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import Optimizer


class Lamb(Optimizer):
    """LAMB from "Reducing BERT Pre-Training Time from 3 Days to 76 Minutes"."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                beta1, beta2 = group["betas"]
                state["step"] += 1

                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)

                weight_norm = p.pow(2).sum().sqrt().clamp(0, 10)
                adam_step = exp_avg / exp_avg_sq.sqrt().add(group["eps"])
                if group["weight_decay"] != 0:
                    adam_step.add_(p, alpha=group["weight_decay"])
                adam_norm = adam_step.pow(2).sum().sqrt()
                trust_ratio = weight_norm / adam_norm
                state["trust_ratio"] = trust_ratio
                p.add_(adam_step * (-group["lr"] * trust_ratio))


class TriageNet(nn.Module):
    def __init__(self, n_feat, hidden, n_cat, n_prio):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(n_feat, hidden), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(hidden, hidden), nn.ReLU(),
        )
        self.category_head = nn.Linear(hidden, n_cat)
        self.priority_head = nn.Linear(hidden, n_prio)

    def forward(self, x):
        h = self.encoder(x)
        return self.category_head(h), self.priority_head(h)


def make_tickets(n, n_feat, n_cat, n_prio, labelled_frac, gen):
    x = torch.randn(n, n_feat, generator=gen)
    w_cat = torch.randn(n_feat, n_cat, generator=gen)
    w_prio = torch.randn(n_feat, n_prio, generator=gen)
    cat = (x @ w_cat).argmax(1)
    prio = (x @ w_prio).argmax(1)
    has_prio = torch.rand(n, generator=gen) < labelled_frac
    # tickets are exported oldest-first; priority labelling started later on
    has_prio[: n // 10] = False
    return x, cat, prio, has_prio


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    n_feat, n_cat, n_prio = 48, 6, 3
    x, cat, prio, has_prio = make_tickets(6000, n_feat, n_cat, n_prio, 0.2, gen)

    model = TriageNet(n_feat, 128, n_cat, n_prio)
    opt = Lamb(model.parameters(), lr=2e-3)
    bs = 256
    for epoch in range(3):
        for it, s in enumerate(range(0, len(x), bs)):
            xb, cb, pb, mb = x[s : s + bs], cat[s : s + bs], prio[s : s + bs], has_prio[s : s + bs]
            cat_logits, prio_logits = model(xb)
            loss_cat = F.cross_entropy(cat_logits, cb)
            if mb.any():
                loss_prio = F.cross_entropy(prio_logits[mb], pb[mb])
            else:
                loss_prio = prio_logits.sum() * 0.0  # keep the head in the graph
            loss = loss_cat + 0.5 * loss_prio
            opt.zero_grad()
            loss.backward()
            opt.step()
            if it % 4 == 0:
                acc = (cat_logits.argmax(1) == cb).float().mean().item()
                print(f"epoch {epoch} it {it:2d} loss {loss.item():.4f} "
                      f"cat {loss_cat.item():.4f} prio {loss_prio.item():.4f} acc {acc:.2f}")


if __name__ == "__main__":
    main()
