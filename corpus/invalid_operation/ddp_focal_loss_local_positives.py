"""Footstep detection from wrist accelerometer recordings, trained with DDP (gloo, each process
reads its own share of the recording sessions). A 1-D CNN predicts one logit per sample; the
loss is a sigmoid focal loss summed over the batch and divided by the number of footsteps in it,
as in RetinaNet.

Every rank divides by the footsteps of its own batch. Rank 1's sessions are mostly desk work,
so one of its batches soon holds no footstep at all: the focal sum is divided by 0 and the loss
is inf on that rank, and DDP's all-reduce carries the non-finite gradients to rank 0. Divide by
`num_footsteps.clamp_min(1)`, or by the count all-reduced across ranks as detectron2 does.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

RATE = 50  # Hz
WINDOW = 64
SESSIONS = [  # (recording, steps per second)
    ("s01_walk", 1.8),
    ("s02_desk", 0.0),
    ("s03_run", 2.7),
    ("s04_desk", 0.0),
    ("s05_walk", 1.7),
    ("s06_walk", 1.9),
]


def record(cadence, windows, g):
    """One session cut into windows: acceleration magnitude, and 1 at every heel strike."""
    t = torch.arange(windows * WINDOW) / RATE
    signal = 0.02 * torch.randn(t.shape, generator=g)
    strikes = torch.zeros_like(t)
    if cadence > 0:
        first = torch.rand(1, generator=g).item() / cadence
        strikes[(torch.arange(first, t[-1].item(), 1 / cadence) * RATE).long()] = 1.0
        signal += 0.3 * torch.sin(2 * torch.pi * cadence * t)
        signal += 1.5 * strikes + 0.7 * strikes.roll(1) + 0.2 * strikes.roll(2)
    return signal.view(windows, 1, WINDOW), strikes.view(windows, WINDOW)


def load_shard(rank, world_size, windows_per_session=48):
    g = torch.Generator().manual_seed(rank)
    recordings = [record(cadence, windows_per_session, g) for _, cadence in SESSIONS]
    mine = recordings[rank::world_size]
    return TensorDataset(torch.cat([x for x, _ in mine]), torch.cat([y for _, y in mine]))


class FootstepNet(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv1d(1, width, 7, padding=3),
            nn.ReLU(),
            nn.Conv1d(width, width, 7, padding=3),
            nn.ReLU(),
            nn.Conv1d(width, 1, 1),
        )

    def forward(self, x):
        return self.body(x).squeeze(1)


def focal_loss(logits, targets, alpha=0.25, gamma=2.0):
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
    return (alpha_t * ce * (1 - p_t) ** gamma).sum()


def main():
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    loader = DataLoader(load_shard(rank, world_size), batch_size=4, shuffle=True)
    model = DistributedDataParallel(FootstepNet())
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)

    for epoch in range(2):
        for step, (x, y) in enumerate(loader):
            num_footsteps = y.sum()
            loss = focal_loss(model(x), y) / num_footsteps
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            logged = loss.detach().clone()
            dist.all_reduce(logged)
            if rank == 0 and step % 6 == 0:
                print(f"epoch {epoch} step {step} loss {logged.item() / world_size:.4f}")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
