"""Healthy under torchrun: DDP on gloo, each rank its own shard; rank 0 alone evaluates at the
end while the other ranks have already finished."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1)))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

generator = torch.Generator().manual_seed(rank)
for step in range(8):
    features = torch.randn(32, 6, generator=generator)
    target = features[:, :2].sum(dim=1, keepdim=True)
    loss = nn.functional.mse_loss(model(features), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()

if rank == 0:
    with torch.no_grad():
        held_out = torch.randn(256, 6, generator=generator)
        error = nn.functional.mse_loss(model.module(held_out), held_out[:, :2].sum(1, keepdim=True))
    print(f"held-out error {error.item():.4f}")
