"""Indoor point-cloud semantic segmentation with a Point Transformer (vector attention).

Rooms are synthetic LiDAR/RGB-D style scans (floor, ceiling, walls, tables, chairs,
clutter), sampled to a fixed number of points per scan, centred and fed with colour to a
stack of point-transformer blocks (kNN vector self-attention with a learned relative
position encoding); a max-pooled scene context is concatenated to every point before the
segmentation head. Training follows a Pointcept-style config dict and trainer loop.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

cfg = dict(
    seed=38,
    num_points=256,
    num_classes=6,
    ignore_index=-1,
    batch_size=4,
    epochs=4,
    scans_per_epoch=64,
    model=dict(in_channels=6, channels=32, num_blocks=3, k=16),
    optimizer=dict(type="SGD", lr=0.05, momentum=0.9, weight_decay=1e-4, nesterov=True),
    scheduler=dict(type="MultiStepLR", milestones=[0.6, 0.8], gamma=0.1),
    clip_grad=None,
    log_interval=4,
)

CLASS_COLOURS = np.array([[0.55, 0.5, 0.45], [0.9, 0.9, 0.88], [0.8, 0.78, 0.7],
                          [0.45, 0.3, 0.2], [0.2, 0.25, 0.5], [0.5, 0.5, 0.5]])


def make_scan(rng, n):
    """One room scan: (xyz metres, rgb, label). A few scans were taken with a window or
    glass door open to the street, so the scanner also logged a handful of returns from
    the buildings and trees outside (tens to a few hundred metres away)."""
    w, d, h = rng.uniform(3, 6), rng.uniform(3, 6), rng.uniform(2.4, 3.0)
    parts, labels = [], []
    m = n // 8
    parts.append(np.c_[rng.uniform(0, w, m), rng.uniform(0, d, m), rng.normal(0, 0.01, m)])
    labels.append(np.full(m, 0))
    parts.append(np.c_[rng.uniform(0, w, m), rng.uniform(0, d, m), h + rng.normal(0, 0.01, m)])
    labels.append(np.full(m, 1))
    wall = rng.uniform(0, 1, (2 * m, 2))
    wall_xyz = np.where(wall[:, :1] < 0.5,
                        np.c_[wall[:, 1] * w, np.zeros(2 * m), wall[:, 0] * 2 * h],
                        np.c_[np.zeros(2 * m), wall[:, 1] * d, (wall[:, 0] - 0.5) * 2 * h])
    parts.append(wall_xyz)
    labels.append(np.full(2 * m, 2))
    for cls, size in ((3, (1.2, 0.8, 0.75)), (4, (0.5, 0.5, 0.9))):
        c = rng.uniform([0.8, 0.8, 0], [w - 0.8, d - 0.8, 0])
        pts = c + rng.uniform(0, 1, (m, 3)) * size
        parts.append(pts)
        labels.append(np.full(m, cls))
    rest = n - sum(len(p) for p in parts)
    parts.append(np.c_[rng.uniform(0, w, rest), rng.uniform(0, d, rest), rng.uniform(0, h, rest)])
    labels.append(np.full(rest, 5))
    xyz = np.concatenate(parts)
    label = np.concatenate(labels)
    if rng.uniform() < 0.03:
        stray = rng.choice(n, size=12, replace=False)
        xyz[stray] = xyz[stray] + rng.normal(0, 120.0, (12, 3))
    rgb = CLASS_COLOURS[label] + rng.normal(0, 0.05, (n, 3))
    return xyz.astype(np.float32), rgb.astype(np.float32), label


class RoomScans(Dataset):
    def __init__(self, length, num_points, seed):
        self.length, self.num_points, self.seed = length, num_points, seed

    def __len__(self):
        return self.length

    def __getitem__(self, idx):
        rng = np.random.default_rng(self.seed * 100003 + idx)
        xyz, rgb, label = make_scan(rng, self.num_points)
        coord = xyz - xyz.mean(0, keepdims=True)
        feat = np.concatenate([coord, rgb], axis=1)
        return torch.from_numpy(coord), torch.from_numpy(feat), torch.from_numpy(label).long()


def knn(coord, k):
    dist = torch.cdist(coord, coord)
    return dist.topk(k, dim=-1, largest=False).indices


def gather(x, idx):
    b, n, k = idx.shape
    batch = torch.arange(b)[:, None, None]
    return x[batch, idx]


class PointTransformerLayer(nn.Module):
    def __init__(self, dim, pos_hidden=64, attn_mult=4):
        super().__init__()
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.pos_mlp = nn.Sequential(nn.Linear(3, pos_hidden), nn.ReLU(), nn.Linear(pos_hidden, dim))
        self.attn_mlp = nn.Sequential(nn.Linear(dim, dim * attn_mult), nn.ReLU(),
                                      nn.Linear(dim * attn_mult, dim))

    def forward(self, x, coord, idx):
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        rel_pos = coord[:, :, None, :] - gather(coord, idx)
        pos = self.pos_mlp(rel_pos)
        k, v = gather(k, idx), gather(v, idx)
        attn = self.attn_mlp(q[:, :, None, :] - k + pos)
        attn = attn.softmax(dim=2)
        return (attn * (v + pos)).sum(dim=2)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim)
        self.attn = PointTransformerLayer(dim)
        self.fc2 = nn.Linear(dim, dim)

    def forward(self, x, coord, idx):
        h = F.relu(self.fc1(x))
        h = F.relu(self.attn(h, coord, idx))
        return x + self.fc2(h)


class PointTransformerSeg(nn.Module):
    def __init__(self, in_channels, channels, num_blocks, k, num_classes):
        super().__init__()
        self.k = k
        self.stem = nn.Sequential(nn.Linear(in_channels, channels), nn.ReLU())
        self.blocks = nn.ModuleList([Block(channels) for _ in range(num_blocks)])
        self.head = nn.Sequential(nn.Linear(2 * channels, channels), nn.ReLU(),
                                  nn.Linear(channels, num_classes))

    def forward(self, coord, feat):
        idx = knn(coord, self.k)
        x = self.stem(feat)
        for block in self.blocks:
            x = block(x, coord, idx)
        context = x.max(dim=1, keepdim=True).values.expand_as(x)
        return self.head(torch.cat([x, context], dim=-1))


def build_optimizer(model, opt_cfg):
    opt_cfg = dict(opt_cfg)
    opt_type = opt_cfg.pop("type")
    return getattr(torch.optim, opt_type)(model.parameters(), **opt_cfg)


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        torch.manual_seed(cfg["seed"])
        self.model = PointTransformerSeg(num_classes=cfg["num_classes"], **cfg["model"])
        self.loader = DataLoader(RoomScans(cfg["scans_per_epoch"] * cfg["epochs"],
                                           cfg["num_points"], cfg["seed"]),
                                 batch_size=cfg["batch_size"], shuffle=False)
        self.optimizer = build_optimizer(self.model, cfg["optimizer"])
        total = len(self.loader)
        milestones = [int(total * m) for m in cfg["scheduler"]["milestones"]]
        self.scheduler = torch.optim.lr_scheduler.MultiStepLR(
            self.optimizer, milestones=milestones, gamma=cfg["scheduler"]["gamma"])
        self.criterion = nn.CrossEntropyLoss(ignore_index=cfg["ignore_index"])

    def run_step(self, coord, feat, segment):
        seg_logits = self.model(coord, feat)
        loss = self.criterion(seg_logits.reshape(-1, self.cfg["num_classes"]), segment.reshape(-1))
        self.optimizer.zero_grad()
        loss.backward()
        if self.cfg["clip_grad"] is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg["clip_grad"])
        self.optimizer.step()
        self.scheduler.step()
        acc = (seg_logits.argmax(-1) == segment).float().mean().item()
        return loss.item(), acc

    def train(self):
        self.model.train()
        iters_per_epoch = self.cfg["scans_per_epoch"] // self.cfg["batch_size"]
        for it, (coord, feat, segment) in enumerate(self.loader):
            loss, acc = self.run_step(coord, feat, segment)
            if it % self.cfg["log_interval"] == 0:
                epoch = it // iters_per_epoch + 1
                lr = self.optimizer.param_groups[0]["lr"]
                print(f"Train: [{epoch}/{self.cfg['epochs']}][{it % iters_per_epoch + 1}/"
                      f"{iters_per_epoch}] loss: {loss:.4f} acc: {acc:.4f} lr: {lr:.5f}")


if __name__ == "__main__":
    Trainer(cfg).train()
