"""Imitation-learning ego planner on vectorised map + agent features (PyTorch Lightning).

nuPlan-style setup: every scenario gives the ego history, the nearby agents and the
lane polylines collected around the ego (all in the ego frame, metres); the model
predicts the next 16 ego poses (x, y) at 0.5 s. Trained in 16-bit to halve memory.
"""
import math

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

CONFIG = {
    "num_scenarios": 640,
    "num_lanes": 12,
    "points_per_lane": 10,
    "num_agents": 8,
    "history_steps": 4,
    "future_steps": 16,
    "map_radius": 200.0,
    "hidden": 32,
    "batch_size": 16,
    "lr": 1e-2,
    "max_epochs": 3,
    "precision": "16-true",
}


class ScenarioDataset(Dataset):
    """Synthetic scenarios: urban scenes plus a few highway scenes with long lanes."""

    def __init__(self, cfg, seed=0):
        g = torch.Generator().manual_seed(seed)
        n, m, p = cfg["num_scenarios"], cfg["num_lanes"], cfg["points_per_lane"]
        highway = torch.rand(n, generator=g) < 0.004
        # lane start points and directions around the ego
        r = 120.0 * torch.rand(n, m, generator=g).sqrt()
        r = torch.where(highway[:, None], 200.0 * torch.rand(n, m, generator=g).sqrt(), r)
        phi = 2 * math.pi * torch.rand(n, m, generator=g)
        start = torch.stack([r * phi.cos(), r * phi.sin()], -1)
        heading = 2 * math.pi * torch.rand(n, m, generator=g)
        length = 20.0 + 60.0 * torch.rand(n, m, generator=g)
        length = torch.where(highway[:, None], 150.0 + 100.0 * torch.rand(n, m, generator=g), length)
        s = torch.linspace(0, 1, p)
        direction = torch.stack([heading.cos(), heading.sin()], -1)
        self.lanes = start[:, :, None, :] + length[:, :, None, None] * s[None, None, :, None] * direction[:, :, None, :]

        speed = 2.0 + 18.0 * torch.rand(n, generator=g)
        yaw_rate = 0.15 * torch.randn(n, generator=g)
        t_hist = -0.5 * torch.arange(cfg["history_steps"] - 1, -1, -1).float()
        t_fut = 0.5 * torch.arange(1, cfg["future_steps"] + 1).float()

        def rollout(t):
            ang = yaw_rate[:, None] * t[None]
            x = speed[:, None] * t[None] * torch.cos(ang / 2)
            y = speed[:, None] * t[None] * torch.sin(ang / 2)
            return torch.stack([x, y], -1)

        self.ego_history = torch.cat([rollout(t_hist), speed[:, None, None].expand(-1, len(t_hist), 1)], -1)
        self.target = rollout(t_fut)
        self.agents = 60.0 * torch.randn(n, cfg["num_agents"], cfg["history_steps"], 2, generator=g)

    def __len__(self):
        return len(self.target)

    def __getitem__(self, i):
        return {
            "ego": self.ego_history[i],
            "agents": self.agents[i],
            "lanes": self.lanes[i],
            "target": self.target[i],
        }


class PolylineEncoder(nn.Module):
    def __init__(self, in_dim, hidden):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.out = nn.Linear(2 * hidden, hidden)

    def forward(self, pts):                       # (B, M, P, in_dim)
        h = self.mlp(pts)
        pooled = h.max(dim=2, keepdim=True).values.expand_as(h)
        h = self.out(torch.cat([h, pooled], -1))
        return h.max(dim=2).values                 # (B, M, hidden)


class VectorPlanner(L.LightningModule):
    def __init__(self, cfg):
        super().__init__()
        self.save_hyperparameters(cfg)
        hidden = cfg["hidden"]
        self.map_radius = cfg["map_radius"]
        self.lane_encoder = PolylineEncoder(4, hidden)
        self.agent_encoder = PolylineEncoder(2, hidden)
        self.ego_encoder = nn.Sequential(nn.Linear(cfg["history_steps"] * 3, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.head = nn.Sequential(nn.Linear(2 * hidden, 2 * hidden), nn.ReLU(), nn.Linear(2 * hidden, cfg["future_steps"] * 2))

    def lane_features(self, lanes):
        x, y = lanes[..., 0], lanes[..., 1]
        dist = torch.sqrt(x * x + y * y)
        bearing = torch.atan2(y, x)
        feats = torch.stack([x, y, dist, bearing * self.map_radius], -1)
        return feats / self.map_radius

    def forward(self, batch):
        lanes = self.lane_encoder(self.lane_features(batch["lanes"]))
        agents = self.agent_encoder(batch["agents"] / self.map_radius)
        ego = self.ego_encoder(batch["ego"].flatten(1) / 20.0)
        tokens = torch.cat([lanes, agents], dim=1)
        q = self.query(ego)[:, None]
        scores = (q * self.key(tokens)).sum(-1) / math.sqrt(tokens.shape[-1])
        context = (scores.softmax(-1)[..., None] * self.value(tokens)).sum(1)
        traj = self.head(torch.cat([ego, context], -1))
        return traj.view(traj.shape[0], -1, 2) * 10.0

    def training_step(self, batch, batch_idx):
        pred = self(batch)
        loss = F.smooth_l1_loss(pred, batch["target"])
        print(f"epoch {self.current_epoch} step {self.global_step:3d} "
              f"loss {loss.item():.4f} ({pred.dtype})")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)


def main():
    torch.manual_seed(0)
    L.seed_everything(0, verbose=False)
    train_set = ScenarioDataset(CONFIG, seed=0)
    loader = DataLoader(train_set, batch_size=CONFIG["batch_size"], shuffle=True)
    model = VectorPlanner(CONFIG)
    trainer = L.Trainer(
        accelerator="cpu",
        precision=CONFIG["precision"],
        max_epochs=CONFIG["max_epochs"],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader)


if __name__ == "__main__":
    main()
