"""Indoor point-cloud semantic segmentation with a Pointcept-style augmentation pipeline.

Most scenes come from an RGB-D scanner, but a few were captured with a LiDAR that stores no
colour, so their ``color`` array is all zeros.  ``ChromaticAutoContrast`` rescales each colour
channel with ``255 / (hi - lo)``; for a colourless scene hi == lo == 0, the scale is inf and
``(color - lo) * scale`` is 0 * inf = NaN.  The augmentation only fires with p=0.2, so training
runs normally until the first colourless scene is auto-contrasted, then the whole batch's
features are NaN and so is the loss / the weights.

Reproduces: https://github.com/Pointcept/Pointcept/pull/530
("Fix divide-by-zero error in color normalization when color data is all zeros")
Fix: only divide where ``hi - lo > 0`` (return the scene unchanged when no channel varies), e.g.
``scale = np.divide(255, diff, out=np.ones_like(diff), where=diff > 0)``.
"""
import copy
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

SEED = 7
NUM_CLASSES = 4  # floor, wall, furniture, ceiling


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, data_dict):
        for t in self.transforms:
            data_dict = t(data_dict)
        return data_dict


class CenterShift:
    def __call__(self, data_dict):
        x_min, y_min, z_min = data_dict["coord"].min(axis=0)
        x_max, y_max, _ = data_dict["coord"].max(axis=0)
        data_dict["coord"] -= [(x_min + x_max) / 2, (y_min + y_max) / 2, z_min]
        return data_dict


class RandomRotateZ:
    def __call__(self, data_dict):
        angle = np.random.uniform(-1, 1) * np.pi
        c, s = np.cos(angle), np.sin(angle)
        rot = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])
        data_dict["coord"] = data_dict["coord"] @ rot.T
        return data_dict


class ChromaticAutoContrast:
    def __init__(self, p=0.2, blend_factor=None):
        self.p = p
        self.blend_factor = blend_factor

    def __call__(self, data_dict):
        if "color" in data_dict and np.random.rand() < self.p:
            lo = np.min(data_dict["color"], 0, keepdims=True)
            hi = np.max(data_dict["color"], 0, keepdims=True)
            scale = 255 / (hi - lo)
            contrast_feat = (data_dict["color"][:, :3] - lo) * scale
            blend = np.random.rand() if self.blend_factor is None else self.blend_factor
            data_dict["color"][:, :3] = (1 - blend) * data_dict["color"][:, :3] + blend * contrast_feat
        return data_dict


class ChromaticTranslation:
    def __init__(self, p=0.95, ratio=0.05):
        self.p, self.ratio = p, ratio

    def __call__(self, data_dict):
        if "color" in data_dict and np.random.rand() < self.p:
            tr = (np.random.rand(1, 3) - 0.5) * 255 * 2 * self.ratio
            data_dict["color"][:, :3] = np.clip(tr + data_dict["color"][:, :3], 0, 255)
        return data_dict


class ChromaticJitter:
    def __init__(self, p=0.95, std=0.005):
        self.p, self.std = p, std

    def __call__(self, data_dict):
        if "color" in data_dict and np.random.rand() < self.p:
            noise = np.random.randn(data_dict["color"].shape[0], 3) * self.std * 255
            data_dict["color"][:, :3] = np.clip(noise + data_dict["color"][:, :3], 0, 255)
        return data_dict


class NormalizeColor:
    def __call__(self, data_dict):
        data_dict["color"] = data_dict["color"] / 255
        return data_dict


def make_scene(rng, num_points, has_rgb):
    """Synthetic room: floor, 4 walls, a table and a ceiling, with per-class colours."""
    size = rng.uniform(3.0, 6.0, size=2)
    height = rng.uniform(2.4, 3.0)
    label = rng.choice(NUM_CLASSES, size=num_points, p=[0.3, 0.35, 0.2, 0.15])
    coord = np.zeros((num_points, 3))
    coord[:, :2] = rng.uniform(0, 1, size=(num_points, 2)) * size
    coord[label == 0, 2] = 0.0
    coord[label == 3, 2] = height
    walls = label == 1
    coord[walls, 2] = rng.uniform(0, height, size=walls.sum())
    side = rng.integers(0, 2, size=walls.sum())
    coord[walls, 0] = np.where(side == 0, coord[walls, 0], rng.choice([0.0, 1.0], size=walls.sum()) * size[0])
    coord[walls, 1] = np.where(side == 1, coord[walls, 1], rng.choice([0.0, 1.0], size=walls.sum()) * size[1])
    table = label == 2
    coord[table, 2] = rng.uniform(0.7, 0.8, size=table.sum())
    coord += rng.normal(0, 0.01, size=coord.shape)
    if has_rgb:
        palette = np.array([[120, 90, 60], [200, 200, 190], [80, 50, 30], [240, 240, 240]], dtype=np.float64)
        color = np.clip(palette[label] + rng.normal(0, 12, size=(num_points, 3)), 0, 255)
    else:
        color = np.zeros((num_points, 3))  # LiDAR scan: no RGB channel stored
    return {"coord": coord.astype(np.float64), "color": color, "segment": label.astype(np.int64)}


class IndoorScenes(Dataset):
    def __init__(self, num_scenes=60, num_points=2048, colorless=(13, 41), transform=None):
        rng = np.random.default_rng(SEED)
        self.scenes = [make_scene(rng, num_points, has_rgb=i not in colorless) for i in range(num_scenes)]
        self.transform = transform

    def __len__(self):
        return len(self.scenes)

    def __getitem__(self, idx):
        data_dict = copy.deepcopy(self.scenes[idx])
        if self.transform is not None:
            data_dict = self.transform(data_dict)
        feat = np.concatenate([data_dict["coord"], data_dict["color"]], axis=1)
        return torch.from_numpy(feat).float(), torch.from_numpy(data_dict["segment"])


class PointNetSeg(nn.Module):
    def __init__(self, in_channels=6, num_classes=NUM_CLASSES):
        super().__init__()
        self.local = nn.Sequential(
            nn.Conv1d(in_channels, 64, 1), nn.BatchNorm1d(64), nn.ReLU(),
            nn.Conv1d(64, 128, 1), nn.BatchNorm1d(128), nn.ReLU(),
        )
        self.head = nn.Sequential(
            nn.Conv1d(128 + 128, 128, 1), nn.BatchNorm1d(128), nn.ReLU(),
            nn.Conv1d(128, num_classes, 1),
        )

    def forward(self, feat):  # feat: (B, N, C)
        x = self.local(feat.transpose(1, 2))
        g = x.max(dim=2, keepdim=True)[0].expand_as(x)
        return self.head(torch.cat([x, g], dim=1))


def main():
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)

    transform = Compose([
        CenterShift(),
        RandomRotateZ(),
        ChromaticAutoContrast(p=0.2),
        ChromaticTranslation(p=0.95, ratio=0.05),
        ChromaticJitter(p=0.95, std=0.005),
        NormalizeColor(),
    ])
    train_set = IndoorScenes(transform=transform)
    loader = DataLoader(train_set, batch_size=4, shuffle=True, num_workers=0, drop_last=True)

    model = PointNetSeg()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)

    it = 0
    for epoch in range(6):
        model.train()
        for feat, segment in loader:
            logits = model(feat)
            loss = F.cross_entropy(logits, segment)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            it += 1
            if it % 5 == 0:
                acc = (logits.argmax(1) == segment).float().mean().item()
                print(f"epoch {epoch} iter {it:4d} loss {loss.item():.4f} acc {acc:.3f}")
    print("done")


if __name__ == "__main__":
    main()
