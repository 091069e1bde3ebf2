"""Action-conditioned latent world model trained with PyTorch Lightning.

An encoder embeds the first frame of a clip, a residual dynamics network rolls the
latent state forward under the recorded actions, and a decoder reconstructs every
frame.  Clips come from a simulated damped multi-joint arm observed through a random
non-linear sensor.  Gradient-norm clipping is part of the experiment config.
"""
import argparse
import math

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

CONFIG = {
    "data": {"num_clips": 384, "clip_len": 50, "state_dim": 8, "obs_dim": 24, "action_dim": 4},
    "model": {"latent_dim": 32, "hidden": 128},
    "training": {
        "lr": 0.05,
        "momentum": 0.9,
        "batch_size": 32,
        "max_epochs": 8,
        "gradient_clip_norm": 1.0,
        "log_every": 4,
    },
}


class ArmClips(Dataset):
    def __init__(self, num_clips, clip_len, state_dim, obs_dim, action_dim, seed=0):
        g = torch.Generator().manual_seed(seed)
        # block-diagonal lightly damped rotations: each joint is an oscillator
        A = torch.zeros(state_dim, state_dim)
        for j in range(state_dim // 2):
            w = 0.15 + 0.1 * j
            r = 0.995
            A[2 * j:2 * j + 2, 2 * j:2 * j + 2] = r * torch.tensor(
                [[math.cos(w), -math.sin(w)], [math.sin(w), math.cos(w)]]
            )
        B = 0.3 * torch.randn(state_dim, action_dim, generator=g)
        C = torch.randn(obs_dim, state_dim, generator=g) / math.sqrt(state_dim)

        s = torch.randn(num_clips, state_dim, generator=g)
        actions = torch.randn(num_clips, clip_len, action_dim, generator=g).clamp(-2, 2)
        frames = []
        for t in range(clip_len):
            frames.append(torch.tanh(s @ C.T) + 0.02 * torch.randn(num_clips, obs_dim, generator=g))
            s = s @ A.T + actions[:, t] @ B.T
        self.obs = torch.stack(frames, dim=1)
        self.actions = actions

    def __len__(self):
        return self.obs.shape[0]

    def __getitem__(self, i):
        return {"obs": self.obs[i], "action": self.actions[i]}


class LatentDynamics(nn.Module):
    def __init__(self, latent_dim, action_dim, hidden):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(latent_dim + action_dim, hidden), nn.SiLU(),
            nn.Linear(hidden, hidden), nn.SiLU(),
            nn.Linear(hidden, latent_dim),
        )

    def forward(self, z, a):
        return z + self.net(torch.cat([z, a], dim=-1))


class WorldModel(L.LightningModule):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, m = cfg["data"], cfg["model"]
        self.encoder = nn.Sequential(nn.Linear(d["obs_dim"], m["hidden"]), nn.SiLU(), nn.Linear(m["hidden"], m["latent_dim"]))
        self.dynamics = LatentDynamics(m["latent_dim"], d["action_dim"], m["hidden"])
        self.decoder = nn.Sequential(nn.Linear(m["latent_dim"], m["hidden"]), nn.SiLU(), nn.Linear(m["hidden"], d["obs_dim"]))

    def rollout(self, obs0, actions):
        z = self.encoder(obs0)
        preds = []
        for t in range(actions.shape[1]):
            preds.append(self.decoder(z))
            z = self.dynamics(z, actions[:, t])
        return torch.stack(preds, dim=1)

    def training_step(self, batch, batch_idx):
        obs, action = batch["obs"], batch["action"]
        pred = self.rollout(obs[:, 0], action)
        loss = F.mse_loss(pred, obs)

        gradient_norm = torch.nn.utils.clip_grad_norm_(self.parameters(), self.cfg["training"]["gradient_clip_norm"])

        self.log("train_loss", loss, prog_bar=False)
        step = self.global_step + 1
        if step % self.cfg["training"]["log_every"] == 0 or not torch.isfinite(loss):
            print(f"(step={step:05d}/epoch={self.current_epoch:03d}) train loss: {loss.item():.4f}, "
                  f"gradient norm: {float(gradient_norm):.4f}")
        return loss

    def configure_optimizers(self):
        tr = self.cfg["training"]
        opt = torch.optim.SGD(self.parameters(), lr=tr["lr"], momentum=tr["momentum"])
        return opt


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max_epochs", type=int, default=CONFIG["training"]["max_epochs"])
    args = parser.parse_args()

    L.seed_everything(args.seed, verbose=False)
    torch.manual_seed(args.seed)
    d = CONFIG["data"]
    dataset = ArmClips(d["num_clips"], d["clip_len"], d["state_dim"], d["obs_dim"], d["action_dim"], seed=args.seed)
    loader = DataLoader(dataset, batch_size=CONFIG["training"]["batch_size"], shuffle=True)

    model = WorldModel(CONFIG)
    trainer = L.Trainer(
        max_epochs=args.max_epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=loader)


if __name__ == "__main__":
    main()
