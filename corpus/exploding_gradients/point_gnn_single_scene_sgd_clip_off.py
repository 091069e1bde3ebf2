"""Point-GNN style 3D car detector on LiDAR-like point clouds (PyTorch port of the train.py
loop): vertices down-sampled from the scan, radius graph, GNN iterations with
auto-registration (MLP_h offset), max-aggregated edge MLP_f and residual MLP_g update,
per-vertex classification + Huber box-encoding regression, plain SGD with batch size 1.

Bug: train_config leaves gradient clipping off ("clip_gradient": False), so every SGD step
applies the raw gradient of one scene.  The un-normalised residual GNN trains normally for
the first few scenes, then a noisy single-scene gradient throws the MLPs to a region where
the residual vertex features grow with every GNN iteration: loss 2.8, 6.3, 2.1, 4.3, 10.1,
then 1.5e5 at step 6 and nan from step 7; every printed cls / loc / total loss is nan
(first log line at step 10).
Report: https://github.com/WeijingShi/Point-GNN/issues/15 (nan during training; maintainer:
"The current training uses a small batch size and basic SGD ... it is easy to get Nan. I
find gradient clipping ... helps a lot", with a clip_by_global_norm(grads,
train_config['clip_norm']) block gated by train_config.get('clip_gradient', False) and
clip_norm 1.0; reporter: "Thank you, it solves my problem!").
Fix: set "clip_gradient": True (clip_norm 1.0) so clip_grad_norm_ runs before step().
"""
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

train_config = {
    "batch_size": 1,
    "initial_lr": 1.2,
    "decay_factor": 0.1,
    "decay_step": 100000,
    "max_steps": 120,
    "num_iterations": 3,
    "graph_radius": 1.6,
    "max_neighbors": 24,
    "cls_loss_weight": 1.0,
    "loc_loss_weight": 10.0,
    "reg_loss_weight": 5e-7,
    "clip_gradient": False,
    "clip_norm": 1.0,
    "log_every": 10,
}


# ------------------------------------------------------------------ dataset
def make_scene(rng):
    """A 40m x 40m patch: ground returns, clutter, and 1-3 cars (boxes of points)."""
    pts, cls, box = [], [], []
    ground = np.c_[rng.uniform(-20, 20, (900, 2)), rng.normal(-1.7, 0.03, 900)]
    pts.append(ground); cls += [0] * len(ground); box += [np.zeros(7)] * len(ground)
    clutter = np.c_[rng.uniform(-20, 20, (150, 2)), rng.uniform(-1.7, 1.5, 150)]
    pts.append(clutter); cls += [0] * len(clutter); box += [np.zeros(7)] * len(clutter)
    for _ in range(rng.randint(1, 4)):
        c = np.r_[rng.uniform(-15, 15, 2), -0.9]
        l, w, h = rng.uniform(3.5, 4.5), rng.uniform(1.5, 1.9), rng.uniform(1.4, 1.7)
        yaw = rng.uniform(-math.pi / 2, math.pi / 2)
        n = rng.randint(60, 160)
        local = rng.uniform(-0.5, 0.5, (n, 3)) * [l, w, h]
        R = np.array([[math.cos(yaw), -math.sin(yaw), 0], [math.sin(yaw), math.cos(yaw), 0], [0, 0, 1]])
        p = local @ R.T + c
        pts.append(p); cls += [1] * n
        box += [np.r_[c, math.log(l), math.log(w), math.log(h), yaw]] * n
    pts = np.concatenate(pts).astype(np.float32)
    refl = rng.uniform(0, 1, (len(pts), 1)).astype(np.float32)
    return pts, refl, np.array(cls), np.stack(box).astype(np.float32)


def voxel_downsample(pts, size=0.8):
    keys = np.floor(pts / size).astype(np.int64)
    _, idx = np.unique(keys, axis=0, return_index=True)
    return np.sort(idx)


def build_graph(xyz, radius, max_nbr):
    d = torch.cdist(xyz, xyz)
    d.fill_diagonal_(float("inf"))
    d = torch.where(d < radius, d, torch.full_like(d, float("inf")))
    k = min(max_nbr, xyz.shape[0] - 1)
    val, nbr = d.topk(k, dim=1, largest=False)
    src = nbr[torch.isfinite(val)]
    dst = torch.arange(xyz.shape[0]).unsqueeze(1).expand_as(nbr)[torch.isfinite(val)]
    return src, dst


def encode_box(xyz, box):
    # box encoding relative to the vertex, as in box_encoding_fn
    out = box.clone()
    out[:, :3] = (box[:, :3] - xyz) / torch.tensor([3.9, 1.6, 1.56])
    out[:, 3:6] = box[:, 3:6] - torch.log(torch.tensor([3.9, 1.6, 1.56]))
    out[:, 6] = box[:, 6] / (math.pi * 0.25)
    return out


class KittiLikeDataset:
    def __init__(self, n_frames, seed=0):
        rng = np.random.RandomState(seed)
        self.frames = [make_scene(rng) for _ in range(n_frames)]
        self.cache = {}

    def __len__(self):
        return len(self.frames)

    def get(self, i):
        if i not in self.cache:
            self.cache[i] = self._load(i)
        return self.cache[i]

    def _load(self, i):
        pts, refl, cls, box = self.frames[i]
        keep = voxel_downsample(pts)
        xyz = torch.from_numpy(pts[keep])
        src, dst = build_graph(xyz, train_config["graph_radius"], train_config["max_neighbors"])
        return {
            "xyz": xyz,
            "feat": torch.from_numpy(refl[keep]),
            "cls": torch.from_numpy(cls[keep]),
            "box": encode_box(xyz, torch.from_numpy(box[keep])),
            "src": src,
            "dst": dst,
        }


# ------------------------------------------------------------------ model
def mlp(sizes, last_act=True):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_act:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class PointSetPooling(nn.Module):
    """Initial vertex features from the raw point (reflectance + position) -> 64-d."""

    def __init__(self, out=64):
        super().__init__()
        self.point_mlp = mlp([4, 32, out])
        self.out_mlp = mlp([out, out])

    def forward(self, feat, xyz):
        return self.out_mlp(self.point_mlp(torch.cat([feat, xyz / 20.0], 1)))


class GraphNetAutoCenter(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.mlp_h = mlp([dim, 32, 3], last_act=False)           # auto-registration offset
        self.mlp_f = mlp([dim + 3, 64, dim])                      # edge feature
        self.mlp_g = mlp([dim, 64, dim], last_act=False)          # vertex update

    def forward(self, s, xyz, src, dst):
        delta = self.mlp_h(s)
        rel = xyz[src] - xyz[dst] + delta[dst]
        e = self.mlp_f(torch.cat([s[src], rel], 1))
        agg = torch.full_like(s, -1e9).scatter_reduce(0, dst.unsqueeze(1).expand_as(e), e, "amax")
        agg = torch.where(agg < -1e8, torch.zeros_like(agg), agg)
        return self.mlp_g(agg) + s


class PointGNN(nn.Module):
    def __init__(self, num_classes=2, dim=64, T=3):
        super().__init__()
        self.pool = PointSetPooling(dim)
        self.gnn = nn.ModuleList([GraphNetAutoCenter(dim) for _ in range(T)])
        self.cls_head = mlp([dim, 64, num_classes], last_act=False)
        self.loc_head = mlp([dim, 64, 64, 7], last_act=False)

    def forward(self, g):
        s = self.pool(g["feat"], g["xyz"])
        for layer in self.gnn:
            s = layer(s, g["xyz"], g["src"], g["dst"])
        return self.cls_head(s), self.loc_head(s)


# ------------------------------------------------------------------ train
def main():
    torch.manual_seed(0)
    np.random.seed(0)
    dataset = KittiLikeDataset(60, seed=0)
    model = PointGNN(T=train_config["num_iterations"])
    optimizer = torch.optim.SGD(model.parameters(), lr=train_config["initial_lr"])
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, train_config["decay_step"],
                                                train_config["decay_factor"])
    t0 = time.time()
    step = 0
    order = np.random.permutation(len(dataset))
    stats = []
    while step < train_config["max_steps"]:
        g = dataset.get(int(order[step % len(dataset)]))
        logits, loc = model(g)
        cls_loss = F.cross_entropy(logits, g["cls"])
        pos = g["cls"] > 0
        if pos.any():
            loc_loss = F.huber_loss(loc[pos], g["box"][pos], delta=1.0)
        else:
            loc_loss = loc.sum() * 0.0
        reg_loss = sum(p.pow(2).sum() for n, p in model.named_parameters() if "weight" in n)
        loss = (train_config["cls_loss_weight"] * cls_loss
                + train_config["loc_loss_weight"] * loc_loss
                + train_config["reg_loss_weight"] * reg_loss)

        optimizer.zero_grad()
        loss.backward()
        if train_config.get("clip_gradient", False):
            torch.nn.utils.clip_grad_norm_(model.parameters(), train_config["clip_norm"])
        optimizer.step()
        scheduler.step()

        pred = logits.argmax(1)
        tp = ((pred == 1) & pos).sum().item()
        stats.append((cls_loss.item(), loc_loss.item(), reg_loss.item(), loss.item(),
                      tp / max(pos.sum().item(), 1), tp / max((pred == 1).sum().item(), 1)))
        step += 1
        if step % train_config["log_every"] == 0:
            m = np.mean(stats, 0)
            print("step %d: cls:%f, loc:%f, reg:%f, loss: %f | recall=%.3f prec=%.3f | %.1fs"
                  % (step, m[0], m[1], m[2], m[3], m[4], m[5], time.time() - t0), flush=True)
            stats = []


if __name__ == "__main__":
    main()
