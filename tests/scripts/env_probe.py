"""Healthy: records how it was run (argv, __name__, cwd, sys.path, the environment) and trains
from a DataLoader with two worker processes, so tests can check nandoctor runs it like
`python`."""

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

record = {
    "argv": sys.argv,
    "name": __name__,
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "path": sys.path,
    "environ": dict(os.environ),
}
out_path = sys.argv[sys.argv.index("--record") + 1]

dataset = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = DataLoader(dataset, batch_size=16, shuffle=True, num_workers=2)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
batches = 0
for epoch in range(2):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        batches += 1
record["batches"] = batches
with open(out_path, "w") as file:
    json.dump(record, file)
