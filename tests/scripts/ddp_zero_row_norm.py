"""Planted bug under torchrun: a hand-written L2 norm, sqrt(sum(x**2)), of embeddings. From step
2 on, rank 1's shard holds a padding row of zeros, whose norm has gradient 0/0 in backward; DDP's
gradient all-reduce then carries the NaN to rank 0."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Linear(8, 8, bias=False))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

generator = torch.Generator().manual_seed(7 + rank)
for step in range(10):
    tokens = torch.randn(16, 8, generator=generator)
    if rank == 1 and step >= 2:
        tokens[-1] = 0.0  # a padding row
    embeddings = model(tokens)
    lengths = torch.sqrt((embeddings**2).sum(dim=1))  # its gradient at a zero row is 0/0
    loss = (lengths - 1.0).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

dist.destroy_process_group()
