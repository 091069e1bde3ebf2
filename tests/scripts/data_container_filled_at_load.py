"""Planted bug: the table is parsed once, before training, and a blank field becomes NaN; the
Dataset only slices rows out of it. The line to fix is where the table is made (inside
`parse_table`, which the script calls to build it), not the `__getitem__` that serves a row."""

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


def parse_table(text):
    return np.array(  # fix here
        [
            [float(field) if field else np.nan for field in row.split(",")]
            for row in text.splitlines()
        ],
        dtype=np.float32,
    )


class Rows(Dataset):
    def __init__(self, table):
        self.features = torch.from_numpy(table[:, :-1])
        self.targets = torch.from_numpy(table[:, -1:])

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.features[i], self.targets[i]


rng = np.random.default_rng(0)
lines = [",".join(f"{v:.3f}" for v in rng.normal(size=5)) for _ in range(256)]
lines[200] = lines[200].rsplit(",", 1)[0] + ","  # a row exported without its target
table = parse_table("\n".join(lines))
loader = DataLoader(Rows(table), batch_size=16)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for features, targets in loader:
    loss = torch.nn.functional.mse_loss(model(features), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(loss.item())
