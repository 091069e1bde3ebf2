"""Claim-severity regression MLP trained with Hugging Face Accelerate.

Policy features (standardised) -> expected claim amount (in thousands).  Claim
amounts are heavy tailed: most are a few thousand, a handful are catastrophic
losses hundreds of times larger, so the run relies on gradient-norm clipping
(max_grad_norm) to survive the batches that contain one of them.
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from accelerate import Accelerator
from accelerate.utils import set_seed


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--num_policies", type=int, default=4096)
    p.add_argument("--num_features", type=int, default=16)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--learning_rate", type=float, default=0.03)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--max_grad_norm", type=float, default=1.0)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--log_every", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class ClaimsDataset(Dataset):
    def __init__(self, n, d, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, d, generator=g)
        w = torch.randn(d, generator=g)
        base = torch.tanh(self.x @ w / 4) * 3 + 0.5 * self.x[:, 0] * self.x[:, 1]
        shocks = torch.distributions.StudentT(torch.tensor(0.9)).sample((n,))
        self.y = base + 0.3 * shocks

    def __len__(self):
        return self.x.shape[0]

    def __getitem__(self, i):
        return {"features": self.x[i], "claim": self.y[i]}


class SeverityMLP(nn.Module):
    def __init__(self, d, hidden=128):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x):
        return self.net(x).squeeze(-1)


def main():
    args = parse_args()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.gradient_accumulation_steps)
    set_seed(args.seed)

    dataset = ClaimsDataset(args.num_policies, args.num_features, args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    model = SeverityMLP(args.num_features)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate, momentum=args.momentum)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=200, gamma=0.5)
    criterion = nn.MSELoss()

    model, optimizer, loader, lr_scheduler = accelerator.prepare(model, optimizer, loader, lr_scheduler)
    params_to_clip = model.parameters()

    global_step = 0
    for epoch in range(args.epochs):
        model.train()
        for batch in loader:
            with accelerator.accumulate(model):
                pred = model(batch["features"])
                loss = criterion(pred, batch["claim"])
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(params_to_clip, args.max_grad_norm)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            global_step += 1
            if global_step % args.log_every == 0:
                accelerator.print(f"epoch {epoch} step {global_step:4d}  mse {loss.item():.4f}")
        accelerator.print(f"epoch {epoch} finished")


if __name__ == "__main__":
    main()
