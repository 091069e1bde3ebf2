"""Motion diffusion model (PARC-style MDM) trained on windows of mocap clips.

Setting: a transformer denoiser predicts x_0 for windows of 20 frames (root position, root
exp-map rotation and 10 spherical joints as exp maps).  The loss is PARC's
motion_difference(): "simple" losses on positions and on the quaternion angle between the
true and predicted rotations, plus velocity losses on root / joint angular velocities computed
with quat_to_exp_map(quat_diff(q[t], q[t+1])).  Clips shorter than the window (two short
transition takes) are zero-padded, and the prediction is multiplied by the frame mask so the
padded frames match the zero targets.

Bug: torch_util.quat_to_axis_angle() computes ``axis = q[..., 0:3] / length`` and only
afterwards swaps the axis of near-identity rotations for a default axis with torch.where.  The
padded predicted frames are all identity quaternions, so the relative rotation of two
consecutive padded frames has length exactly 0: the forward value is hidden by torch.where,
but the backward of the division is 0 / 0 = NaN.  The NaN gradient passes through the
mask multiplication (0 * NaN = NaN) into every weight: the loss printed for step 12 (the
first batch holding a padded window, late in epoch 0) is still finite, AdamW then writes NaN
into the weights and from step 13 on the loss is NaN.

Fix (merged in PARC PR #9, commit 7602345): clamp the length before dividing,
``safe_length = length.unsqueeze(-1).clamp(min=1e-6); axis = q[..., qx:qw] / safe_length``.

Report: https://github.com/mshoe/PARC/pull/9 ("Fix NaN Loss due to Numerical Instability in
Quaternion Conversions during MDM training").
"""
import math

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

CFG = {
    "seed": 9,
    "num_joints": 10,
    "seq_len": 20,
    "window_stride": 8,
    "fps": 30,
    "diffusion_timesteps": 50,
    "d_model": 64,
    "num_layers": 2,
    "batch_size": 32,
    "lr": 2e-4,
    "epochs": 3,
    "w_simple_root_pos": 1.0,
    "w_simple_rot": 1.0,
    "w_vel_root_rot": 0.01,
    "w_vel_joint_rot": 0.01,
}


# ----------------------------------------------------------------- torch_util
def normalize(x, eps: float = 1e-9):
    return x / x.norm(p=2, dim=-1).clamp(min=eps).unsqueeze(-1)


def quat_conjugate(q):
    return torch.cat([-q[..., :3], q[..., 3:]], dim=-1)


def quat_pos(q):
    z = (q[..., 3:] < 0).float()
    return (1 - 2 * z) * q


def quat_mul(a, b):
    x1, y1, z1, w1 = a.unbind(-1)
    x2, y2, z2, w2 = b.unbind(-1)
    w = w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2
    x = w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2
    y = w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2
    z = w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2
    return torch.stack([x, y, z, w], dim=-1)


def quat_diff(q0, q1):
    return quat_mul(q1, quat_conjugate(q0))


def quat_to_axis_angle(q):
    eps = 1e-5
    qx, qw = 0, 3
    # need to make sure w is not negative to calculate geodesic distance
    q = quat_pos(q)
    length = torch.norm(q[..., 0:3], dim=-1, p=2)
    angle = 2.0 * torch.atan2(length, q[..., qw])
    axis = q[..., qx:qw] / length.unsqueeze(-1)

    default_axis = torch.zeros_like(axis)
    default_axis[..., -1] = 1
    mask = length > eps
    angle = torch.where(mask, angle, torch.zeros_like(angle))
    axis = torch.where(mask.unsqueeze(-1), axis, default_axis)
    return axis, angle


def axis_angle_to_exp_map(axis, angle):
    return axis * angle.unsqueeze(-1)


def quat_to_exp_map(q):
    axis, angle = quat_to_axis_angle(q)
    return axis_angle_to_exp_map(axis, angle)


def exp_map_to_quat(exp_map):
    angle = exp_map.norm(dim=-1)
    axis = normalize(exp_map)
    half = 0.5 * angle.unsqueeze(-1)
    return torch.cat([axis * torch.sin(half), torch.cos(half)], dim=-1)


def quat_diff_angle(q0, q1):
    _, angle = quat_to_axis_angle(quat_diff(q0, q1))
    return angle


# ----------------------------------------------------------------- motion data
def make_motion_library(num_joints, fps, rng):
    """Synthetic locomotion clips: [frames, 3 root pos + 3 root rot + 3 * num_joints]."""
    lengths = [int(rng.integers(48, 90)) for _ in range(64)] + [12, 15]   # two short transitions
    clips = []
    for n in lengths:
        t = np.arange(n) / fps
        freq, phase = rng.uniform(0.8, 1.6), rng.uniform(0, 2 * np.pi)
        speed, turn = rng.uniform(0.5, 1.5), rng.uniform(-0.4, 0.4)
        root_pos = np.stack([speed * t, 0.05 * np.sin(2 * np.pi * freq * t), 0.9 + 0.03 * np.cos(4 * np.pi * freq * t)], -1)
        root_rot = np.stack([0.05 * np.sin(2 * np.pi * freq * t + phase), 0.02 * np.ones_like(t), turn * t], -1)
        amp = rng.uniform(0.2, 0.8, size=(num_joints, 3))
        offs = rng.uniform(-0.3, 0.3, size=(num_joints, 3))
        jphase = rng.uniform(0, 2 * np.pi, size=(num_joints, 1))
        joints = offs[None] + amp[None] * np.sin(2 * np.pi * freq * t[:, None, None] + phase + jphase[None])
        clips.append(np.concatenate([root_pos, root_rot, joints.reshape(n, -1)], -1).astype(np.float32))
    return clips


class MotionWindowDataset(Dataset):
    def __init__(self, clips, seq_len, stride):
        self.items = []
        for clip in clips:
            n = clip.shape[0]
            if n < seq_len:
                pad = np.zeros((seq_len - n, clip.shape[1]), np.float32)
                mask = np.r_[np.ones(n), np.zeros(seq_len - n)].astype(np.float32)
                self.items.append((np.concatenate([clip, pad]), mask))
                continue
            for s in range(0, n - seq_len + 1, stride):
                self.items.append((clip[s:s + seq_len], np.ones(seq_len, np.float32)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        x, m = self.items[i]
        return torch.from_numpy(x), torch.from_numpy(m)


# ----------------------------------------------------------------- model
class MDMTransformer(nn.Module):
    def __init__(self, feat_dim, seq_len, d_model, num_layers, timesteps):
        super().__init__()
        self._in_mlp = nn.Sequential(nn.Linear(feat_dim, d_model), nn.SiLU(), nn.Linear(d_model, d_model))
        self._t_embed = nn.Embedding(timesteps, d_model)
        self._pos = nn.Parameter(torch.randn(1, seq_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, 4, 2 * d_model, dropout=0.0, batch_first=True)
        self._transformer = nn.TransformerEncoder(layer, num_layers)
        self._out = nn.Linear(d_model, feat_dim)

    def forward(self, x_t, t):
        h = self._in_mlp(x_t) + self._pos + self._t_embed(t).unsqueeze(1)
        return self._out(self._transformer(h))


class MDM:
    def __init__(self, cfg, feat_dim):
        self._cfg = cfg
        self._num_joints = cfg["num_joints"]
        T = cfg["diffusion_timesteps"]
        s = torch.arange(T + 1) / T
        alpha_bar = torch.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2
        self._alpha_bar = (alpha_bar[1:] / alpha_bar[0]).clamp(min=1e-4)
        self._denoise_model = MDMTransformer(feat_dim, cfg["seq_len"], cfg["d_model"], cfg["num_layers"], T)
        self._optimizer = torch.optim.AdamW(self._denoise_model.parameters(), lr=cfg["lr"])

    def forward_diffusion(self, x_0, t):
        ab = self._alpha_bar[t].view(-1, 1, 1)
        return ab.sqrt() * x_0 + (1 - ab).sqrt() * torch.randn_like(x_0)

    def extract_motion_features(self, feats):
        B, L, _ = feats.shape
        return {
            "root_pos": feats[..., 0:3],
            "root_rot": exp_map_to_quat(feats[..., 3:6]),
            "joint_rot": exp_map_to_quat(feats[..., 6:].reshape(B, L, self._num_joints, 3)),
        }

    def motion_difference(self, true, pred):
        cfg, dt = self._cfg, 1.0 / self._cfg["fps"]
        mse = lambda a, b: ((a - b) ** 2).mean()
        losses = {}
        losses["root_pos"] = cfg["w_simple_root_pos"] * mse(true["root_pos"], pred["root_pos"])
        rot_err = torch.cat([quat_diff_angle(true["root_rot"], pred["root_rot"]).flatten(),
                             quat_diff_angle(true["joint_rot"], pred["joint_rot"]).flatten()])
        losses["rot"] = cfg["w_simple_rot"] * (rot_err ** 2).mean()
        for key, w in (("root_rot", cfg["w_vel_root_rot"]), ("joint_rot", cfg["w_vel_joint_rot"])):
            q_t, q_p = true[key], pred[key]
            vel_true = quat_to_exp_map(quat_diff(q_t[:, :-1], q_t[:, 1:])) / dt
            vel_pred = quat_to_exp_map(quat_diff(q_p[:, :-1], q_p[:, 1:])) / dt
            losses["vel_" + key] = w * mse(vel_true, vel_pred)
        return losses

    def train_step(self, x_0, frame_mask):
        t = torch.randint(0, self._cfg["diffusion_timesteps"], (x_0.shape[0],))
        x_t = self.forward_diffusion(x_0, t)
        pred_x_0 = self._denoise_model(x_t, t) * frame_mask.unsqueeze(-1)
        losses = self.motion_difference(self.extract_motion_features(x_0),
                                        self.extract_motion_features(pred_x_0))
        loss = sum(losses.values())
        self._optimizer.zero_grad()
        loss.backward()
        self._optimizer.step()
        return loss.item(), {k: v.item() for k, v in losses.items()}


def train(cfg):
    torch.manual_seed(cfg["seed"])
    rng = np.random.default_rng(cfg["seed"])
    clips = make_motion_library(cfg["num_joints"], cfg["fps"], rng)
    dataset = MotionWindowDataset(clips, cfg["seq_len"], cfg["window_stride"])
    loader = DataLoader(dataset, batch_size=cfg["batch_size"], shuffle=True,
                        generator=torch.Generator().manual_seed(cfg["seed"]))
    feat_dim = dataset[0][0].shape[-1]
    mdm = MDM(cfg, feat_dim)
    print(f"{len(clips)} clips, {len(dataset)} windows, {len(loader)} batches per epoch")

    step = 0
    for epoch in range(cfg["epochs"]):
        for x_0, frame_mask in loader:
            loss, terms = mdm.train_step(x_0, frame_mask)
            step += 1
            info = "  ".join(f"{k} {v:.4f}" for k, v in terms.items())
            print(f"epoch {epoch} step {step:3d}  loss {loss:.4f}  {info}")


if __name__ == "__main__":
    train(CFG)
