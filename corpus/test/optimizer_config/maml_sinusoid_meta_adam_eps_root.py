"""MAML on few-shot sinusoid regression, with Adam (instead of SGD) as the inner-loop optimizer.

The inner loop is differentiated through (second-order MAML): the adapted weights are
``theta - lr * m_hat / (sqrt(v_hat + eps_root) + eps)`` and the meta-gradient flows back through
``sqrt``.  With the default ``eps_root=0.0`` every weight whose inner gradient is exactly zero
(the weights of a ReLU unit that is silent on all the support points of a task, and the
outgoing weights of that unit) has ``v = 0``; the forward step is fine (0 / eps = 0), but the
backward of ``sqrt`` at 0 is ``0.5 / sqrt(0) = inf`` and ``inf * 0 = nan``.  The nan meta-gradient
is spread to every weight by the double-backward of the support loss, Adam writes it into the
meta-parameters and all later meta-losses are nan.  The script warms up with first-order MAML
(MAML++ derivative-order annealing), which does not differentiate through ``sqrt``, so the nan
appears at the first second-order meta-iteration (100) and every meta-loss after it is nan.

Reproduces: https://github.com/metaopt/torchopt/issues/26 ("Got 'nan' when using MetaAdam as a
inner_opt": nan parameters after the first meta_opt.step(); the maintainers traced it to the
derivative of the square root at 0).  torchopt/optax expose ``eps_root`` exactly for this case
("needed for example when computing (meta-)gradients through Adam").

Fix: build the inner optimizer with a positive ``eps_root`` (1e-8, the value recommended by the
optax maintainers in google-deepmind/optax#882); the meta-training then runs without nan.
"""
import argparse
import math

import numpy as np
import torch
import torch.nn as nn
from torch.func import functional_call


class MetaAdam:
    """Functional, differentiable Adam (same update rule as torchopt.adam / optax.adam)."""

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, eps_root=0.0):
        self.lr = lr
        self.b1, self.b2 = betas
        self.eps = eps
        self.eps_root = eps_root

    def init(self, params):
        return {
            "count": 0,
            "mu": {k: torch.zeros_like(v) for k, v in params.items()},
            "nu": {k: torch.zeros_like(v) for k, v in params.items()},
        }

    def update(self, params, grads, state):
        count = state["count"] + 1
        bc1 = 1.0 - self.b1 ** count
        bc2 = 1.0 - self.b2 ** count
        mu, nu, new_params = {}, {}, {}
        for k, p in params.items():
            g = grads[k]
            mu[k] = self.b1 * state["mu"][k] + (1.0 - self.b1) * g
            nu[k] = self.b2 * state["nu"][k] + (1.0 - self.b2) * g * g
            m_hat = mu[k] / bc1
            v_hat = nu[k] / bc2
            new_params[k] = p - self.lr * m_hat / (torch.sqrt(v_hat + self.eps_root) + self.eps)
        return new_params, {"count": count, "mu": mu, "nu": nu}


class Regressor(nn.Module):
    def __init__(self, hidden=40):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(1, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x):
        return self.net(x)


def sample_tasks(rng, n_tasks, k_shot, k_query):
    """Sinusoid tasks y = A sin(x - phi), A in [0.1, 5], phi in [0, pi], x in [-5, 5]."""
    amp = rng.uniform(0.1, 5.0, size=(n_tasks, 1, 1))
    phase = rng.uniform(0.0, math.pi, size=(n_tasks, 1, 1))
    xs = rng.uniform(-5.0, 5.0, size=(n_tasks, k_shot, 1))
    xq = rng.uniform(-5.0, 5.0, size=(n_tasks, k_query, 1))
    ys = amp * np.sin(xs - phase)
    yq = amp * np.sin(xq - phase)
    t = lambda a: torch.tensor(a, dtype=torch.float32)
    return t(xs), t(ys), t(xq), t(yq)


def adapt(model, params, inner_opt, x, y, steps, second_order):
    state = inner_opt.init(params)
    for _ in range(steps):
        loss = ((functional_call(model, params, (x,)) - y) ** 2).mean()
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=second_order)
        params, state = inner_opt.update(params, dict(zip(params.keys(), grads)), state)
    return params


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--meta-iters", type=int, default=200)
    parser.add_argument("--first-order-iters", type=int, default=100,
                        help="MAML++ derivative-order annealing: first-order MAML for these iterations")
    parser.add_argument("--meta-batch", type=int, default=4)
    parser.add_argument("--k-shot", type=int, default=10)
    parser.add_argument("--k-query", type=int, default=10)
    parser.add_argument("--inner-steps", type=int, default=3)
    parser.add_argument("--inner-lr", type=float, default=0.01)
    parser.add_argument("--meta-lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    model = Regressor()
    meta_opt = torch.optim.Adam(model.parameters(), lr=args.meta_lr)
    inner_opt = MetaAdam(lr=args.inner_lr, betas=(0.9, 0.999), eps=1e-8, eps_root=0.0)

    recent = []
    for it in range(args.meta_iters):
        second_order = it >= args.first_order_iters
        if it == args.first_order_iters:
            print(f"meta-iter {it:4d}  switching to second-order meta-gradients")
        xs, ys, xq, yq = sample_tasks(rng, args.meta_batch, args.k_shot, args.k_query)
        meta_opt.zero_grad()
        meta_loss = 0.0
        for i in range(args.meta_batch):
            params = dict(model.named_parameters())
            fast = adapt(model, params, inner_opt, xs[i], ys[i], args.inner_steps, second_order)
            q_loss = ((functional_call(model, fast, (xq[i],)) - yq[i]) ** 2).mean()
            meta_loss = meta_loss + q_loss / args.meta_batch
        meta_loss.backward()
        meta_opt.step()

        recent = (recent + [meta_loss.item()])[-5:]
        if it % 5 == 4:
            print(f"meta-iter {it:4d}  query mse after {args.inner_steps} Adam steps: "
                  f"{meta_loss.item():.4f}  (avg last 5: {sum(recent) / len(recent):.4f})")

    print(f"done: final query mse {meta_loss.item():.4f}")


if __name__ == "__main__":
    main()
