"""Planted bug under torchrun: each rank standardizes its own shard of features by the shard's
std, and from step 3 on rank 1's shard has a feature that is constant (std 0) -> inf/NaN."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

generator = torch.Generator().manual_seed(100 + rank)
for step in range(12):
    features = torch.randn(32, 6, generator=generator)
    if rank == 1 and step >= 3:
        features[:, 2] = 1.5  # a sensor stuck at one value on this shard
    target = features.sum(dim=1, keepdim=True)
    features = (features - features.mean(0)) / features.std(0)  # std 0 on rank 1 from step 3
    loss = nn.functional.mse_loss(model(features), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)

dist.destroy_process_group()
print(f"rank {rank} done, {os.environ['WORLD_SIZE']} ranks")
