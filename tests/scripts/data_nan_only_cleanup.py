"""Planted bug: the loader already cleans the features of NaN with `x[x != x] = 0`, but an
extractor also wrote -inf, which that test lets through. The line to fix is the clean-up
(`np.isfinite`), not the extractor the dataset ships with."""

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


def extracted_features(rng):
    features = rng.normal(size=(256, 6)).astype(np.float32)
    features[[17, 90], 2] = np.nan  # unvoiced frames
    features[[41, 200], 4] = -np.inf  # log energy of silence
    return features


class Frames(Dataset):
    def __init__(self, features, targets):
        self.features = features
        self.targets = targets

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return torch.from_numpy(self.features[i]), torch.tensor(self.targets[i])


def main():
    rng = np.random.default_rng(0)
    features = extracted_features(rng)
    data = Frames(features, rng.normal(size=256).astype(np.float32))
    data.features[data.features != data.features] = 0  # fix here
    loader = DataLoader(
        data, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    model = torch.nn.Linear(6, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(loss.item())


if __name__ == "__main__":
    main()
