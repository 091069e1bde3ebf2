"""Fails before training starts, for a reason that has nothing to do with NaN."""

import torch


def load_dataset(path):
    raise FileNotFoundError(f"no dataset at {path}")


model = torch.nn.Linear(4, 2)
data = load_dataset("./data/train.pt")
