"""Planted bug (lr too high, as in lr_diverging_sgd.py) in a script that writes files: a log it
appends to, checkpoints saved and renamed into place, a metrics file, a marker it deletes.
From step 8 on only: the unscaled run diverges before that, so only the sweep's re-runs, which
train longer, write anything; every file must land in their scratch folder.
It reads back what it wrote and fails loudly if a read does not see its own write."""

import argparse
import json
import os
from pathlib import Path

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
args = parser.parse_args()
out = Path(args.out)

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.8, momentum=0.9)
x = torch.randn(256, 8)
y = x[:, :1] * 2.0 - x[:, 1:2] + 0.5 * x[:, 2:3] ** 2
for step in range(40):
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step < 8:
        continue
    with open(out / "train.log", "a") as log:
        log.write(f"step {step} loss {loss.item():.4g}\n")
    lines = (out / "train.log").read_text().splitlines()
    assert lines[0] == "an earlier run", lines[:1]
    os.makedirs(out / "checkpoints", exist_ok=True)
    torch.save(model.state_dict(), out / "checkpoints" / "last.pt.tmp")
    os.replace(out / "checkpoints" / "last.pt.tmp", out / "checkpoints" / "last.pt")
    restored = torch.load(out / "checkpoints" / "last.pt")
    assert torch.equal(restored["0.weight"], model[0].weight)
    (out / "metrics.json").write_text(json.dumps({"step": step, "loss": loss.item()}))
    if (out / "keep.txt").exists():
        os.remove(out / "keep.txt")
    assert not (out / "keep.txt").exists()
