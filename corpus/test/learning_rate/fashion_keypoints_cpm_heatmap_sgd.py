"""Convolutional Pose Machine for clothing keypoints (FashionAI-style), PyTorch port.

Synthetic garment crops with a handful of landmarks; each stage of the CPM predicts one
Gaussian heatmap per landmark and is supervised with an l2 heatmap loss (intermediate
supervision).
"""
import time

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

FLAGS = {
    "input_size": 64,
    "heatmap_size": 16,
    "num_of_joints": 4,
    "cpm_stages": 3,
    "joint_gaussian_variance": 1.5,
    "batch_size": 8,
    "init_lr": 0.4,
    "lr_decay_rate": 0.5,
    "lr_decay_step": 10000,
    "momentum": 0.9,
    "training_iters": 60,
    "verbose_iters": 1,
    "num_samples": 512,
}


def make_gaussian_heatmap(size, center, sigma):
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32)
    return np.exp(-((xs - center[0]) ** 2 + (ys - center[1]) ** 2) / (2.0 * sigma ** 2))


class GarmentKeypointSet(Dataset):
    """Random garment-like silhouettes with landmark blobs and their target heatmaps."""

    def __init__(self, n, cfg, seed=0):
        rng = np.random.RandomState(seed)
        s, hs, k = cfg["input_size"], cfg["heatmap_size"], cfg["num_of_joints"]
        scale = hs / s
        self.images = np.zeros((n, 3, s, s), np.float32)
        self.heatmaps = np.zeros((n, k, hs, hs), np.float32)
        for i in range(n):
            img = rng.normal(0.0, 0.15, (3, s, s)).astype(np.float32)
            x0, y0 = rng.randint(6, 20, size=2)
            x1, y1 = rng.randint(44, 58, size=2)
            img[:, y0:y1, x0:x1] += rng.uniform(0.3, 0.8, size=(3, 1, 1)).astype(np.float32)
            corners = [(x0, y0), (x1, y0), (x0, y1), (x1, y1)]
            for j, (cx, cy) in enumerate(corners[:k]):
                cx, cy = cx + rng.uniform(-2, 2), cy + rng.uniform(-2, 2)
                blob = make_gaussian_heatmap(s, (cx, cy), 2.0)
                img[j % 3] += 1.5 * blob
                self.heatmaps[i, j] = make_gaussian_heatmap(
                    hs, (cx * scale, cy * scale), cfg["joint_gaussian_variance"])
            self.images[i] = img

    def __len__(self):
        return len(self.images)

    def __getitem__(self, idx):
        return torch.from_numpy(self.images[idx]), torch.from_numpy(self.heatmaps[idx])


def conv_bn_relu(cin, cout, k=3):
    return nn.Sequential(nn.Conv2d(cin, cout, k, padding=k // 2, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class CPMModel(nn.Module):
    def __init__(self, num_joints, stages):
        super().__init__()
        self.sub_stages = nn.Sequential(
            conv_bn_relu(3, 32), conv_bn_relu(32, 32), nn.MaxPool2d(2),
            conv_bn_relu(32, 48), conv_bn_relu(48, 48), nn.MaxPool2d(2),
            conv_bn_relu(48, 64), conv_bn_relu(64, 32),
        )
        self.stage1 = nn.Sequential(conv_bn_relu(32, 64, 1), nn.Conv2d(64, num_joints, 1))
        self.refine = nn.ModuleList()
        for _ in range(stages - 1):
            self.refine.append(nn.Sequential(
                conv_bn_relu(32 + num_joints, 48, 5), conv_bn_relu(48, 48, 5),
                conv_bn_relu(48, 48, 1), nn.Conv2d(48, num_joints, 1)))

    def forward(self, x):
        feats = self.sub_stages(x)
        heatmaps = [self.stage1(feats)]
        for block in self.refine:
            heatmaps.append(block(torch.cat([feats, heatmaps[-1]], dim=1)))
        return heatmaps


def stage_losses(stage_heatmaps, gt_heatmaps, batch_size):
    # tf.nn.l2_loss(pred - gt) / batch_size for every stage
    return [0.5 * ((hm - gt_heatmaps) ** 2).sum() / batch_size for hm in stage_heatmaps]


def main():
    torch.manual_seed(0)
    cfg = FLAGS
    dataset = GarmentKeypointSet(cfg["num_samples"], cfg)
    loader = DataLoader(dataset, batch_size=cfg["batch_size"], shuffle=True, drop_last=True)
    model = CPMModel(cfg["num_of_joints"], cfg["cpm_stages"])
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg["init_lr"], momentum=cfg["momentum"])
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, cfg["lr_decay_step"], cfg["lr_decay_rate"])

    step = 0
    model.train()
    while step < cfg["training_iters"]:
        for images, gt in loader:
            t0 = time.time()
            losses = stage_losses(model(images), gt, cfg["batch_size"])
            total_loss = sum(losses)
            optimizer.zero_grad()
            total_loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step % cfg["verbose_iters"] == 0 or step == 1:
                print("Step: {}/{} ----- Cur_lr: {:.7f} ----- Time: {:.2f} sec.".format(
                    step, cfg["training_iters"], scheduler.get_last_lr()[0], time.time() - t0))
                print(" | ".join("S{} loss: {:>8.2f}".format(i + 1, l.item())
                                 for i, l in enumerate(losses))
                      + " | Total loss: {:.2f}".format(total_loss.item()))
            if step >= cfg["training_iters"]:
                break
    print("training finished")


if __name__ == "__main__":
    main()
