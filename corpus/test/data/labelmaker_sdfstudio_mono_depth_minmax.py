"""LabelMaker-style lifting_3d pipeline: omnidata depth -> sdfstudio preprocessing -> MonoSDF training.

Setting: a scaled-down copy of cvg/LabelMaker's 3D lifting.  A synthetic RGB-D scan (a sphere
in a textured box room, 12 frames from a ring of cameras, uint16 sensor depth in mm, 4x4
camtoworld poses, intrinsics) is written to a temp scene folder.  `run_omnidepth` mimics
models/omnidata_depth.py: a monocular relative-depth prediction (here a brightness-based
stand-in for the omnidata network, clamped to [0, 1]) is fitted to the valid sensor depth with
a least-squares a * depth + b and stored as uint16.  `sdfstudio_preprocessing` mimics
labelmaker/lifting_3d/preprocessing.py: poses rescaled into the unit cube, intrinsics, colour and
min-max normalised mono depth saved per frame plus meta_data.json.  The trainer then reads the
sdfstudio dataset and fits a MonoSDF-like model (SDF MLP with geometric init, colour MLP, VolSDF
Laplace density, 32 samples per ray, 256 rays from one image per step) with RGB L1, eikonal and
the scale-and-shift invariant mono depth loss on depth * 50 + 0.5, Adam 5e-4.

Bug (https://github.com/cvg/LabelMaker/pull/10, commit e156663 "fixed NaN in sdfstudio
training"): one frame of the scan has no sensor depth at all (every pixel 0).  The omnidata
fit then has no valid pixel, lstsq returns a = b = 0 and that frame's mono depth is all zeros;
`monodepth / monodepth.max()` in the preprocessing is 0 / 0 = NaN for the whole frame.
Training steps are finite until the sampler first draws that frame, then the depth loss, all
gradients and, after the Adam step, all weights are NaN.

Fix (in the preprocessing, merged in PR #10): divide by (monodepth.max() + 1e-8); the frame's
mono depth becomes 0 and the run trains all 100 steps without nan (RGB L1 0.23 -> ~0.14).
"""
import json
import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

logging.basicConfig(level="INFO", format="%(message)s")
log = logging.getLogger(' sdfstudio data preprocessing ')

IMAGE_SIZE = 32
N_FRAMES = 12
ROOM_HALF = 2.0
SPHERE_RADIUS = 0.45


def look_at(cam_pos, target):
  z = target - cam_pos
  z /= np.linalg.norm(z)
  x = np.cross(np.array([0.0, 1.0, 0.0]), z)
  x /= np.linalg.norm(x)
  y = np.cross(z, x)
  pose = np.eye(4)
  pose[:3, 0], pose[:3, 1], pose[:3, 2], pose[:3, 3] = x, y, z, cam_pos
  return pose  # OpenCV camtoworld


def trace_room(origins, dirs):
  """Depth (along z of the camera) and colour of the sphere-in-a-box scene."""
  t_box = np.min(np.where(dirs > 0, (ROOM_HALF - origins) / dirs, (-ROOM_HALF - origins) / dirs), axis=1)
  hit_box = origins + t_box[:, None] * dirs
  checker = (np.floor(hit_box * 2.0).sum(axis=1) % 2)[:, None]
  color = 0.25 + 0.2 * checker * np.array([[0.9, 0.8, 0.6]])
  b = (origins * dirs).sum(1)
  disc = b**2 - ((origins**2).sum(1) - SPHERE_RADIUS**2)
  t_sph = -b - np.sqrt(np.clip(disc, 0, None))
  on_sphere = (disc > 0) & (t_sph > 0)
  normal = (origins + t_sph[:, None] * dirs) / SPHERE_RADIUS
  shade = np.clip(normal @ np.array([0.3, 0.8, -0.5]), 0.1, None)[:, None]
  color = np.where(on_sphere[:, None], shade * (0.55 + 0.45 * normal), color)
  return np.where(on_sphere, t_sph, t_box), color


def capture_scene(scene_dir, rng):
  for sub in ('color', 'depth', 'pose', 'intrinsic'):
    (scene_dir / sub).mkdir(parents=True)
  f = 0.9 * IMAGE_SIZE
  K = np.array([[f, 0, IMAGE_SIZE / 2], [0, f, IMAGE_SIZE / 2], [0, 0, 1]])
  v, u = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE] + 0.5
  cam_dirs = np.stack([(u - K[0, 2]) / f, (v - K[1, 2]) / f, np.ones_like(u)], -1).reshape(-1, 3)
  for idx in range(N_FRAMES):
    angle = 2 * np.pi * idx / N_FRAMES + rng.uniform(-0.1, 0.1)
    cam = np.array([1.3 * np.cos(angle), rng.uniform(-0.3, 0.3), 1.3 * np.sin(angle)])
    pose = look_at(cam, rng.normal(0, 0.1, 3))
    dirs = cam_dirs @ pose[:3, :3].T
    t, color = trace_room(np.repeat(cam[None], len(dirs), 0), dirs / np.linalg.norm(dirs, axis=1, keepdims=True))
    z = t / np.linalg.norm(cam_dirs, axis=1)
    depth_mm = (z * 1000.0).reshape(IMAGE_SIZE, IMAGE_SIZE).astype(np.uint16)
    if idx == 7:  # the structure sensor returned no depth for this frame
      depth_mm[:] = 0
    color = np.clip(color.reshape(IMAGE_SIZE, IMAGE_SIZE, 3) + rng.normal(0, 0.01, (IMAGE_SIZE, IMAGE_SIZE, 3)), 0, 1)
    np.save(scene_dir / 'color' / f'{idx:06d}.npy', color.astype(np.float32))
    np.save(scene_dir / 'depth' / f'{idx:06d}.npy', depth_mm)
    np.savetxt(scene_dir / 'pose' / f'{idx:06d}.txt', pose)
    np.savetxt(scene_dir / 'intrinsic' / f'{idx:06d}.txt', K)


def omnidata_model(img):
  """Stand-in for the omnidata DPT depth head: relative depth in [0, 1] (brighter = closer)."""
  gray = torch.from_numpy(img).mean(-1)[None, None]
  out = 1.0 - F.avg_pool2d(gray, 5, stride=1, padding=2, count_include_pad=False)
  return out.clamp(min=0, max=1)


def run_omnidepth(scene_dir, output_folder='intermediate/depth_omnidata_1'):
  output_dir = scene_dir / output_folder
  output_dir.mkdir(parents=True)
  log.info('[omnidepth] running inference')
  for k in sorted(p.stem for p in (scene_dir / 'color').glob('*.npy')):
    omnidepth = omnidata_model(np.load(scene_dir / 'color' / f'{k}.npy')).squeeze().numpy()
    # find a linear scaling a * depth + b to fit to original depth
    orig_depth = np.load(scene_dir / 'depth' / f'{k}.npy')
    targets = orig_depth[orig_depth != 0]
    source = omnidepth[orig_depth != 0]
    a, b = np.linalg.lstsq(np.stack([source, np.ones_like(source)], axis=-1), targets, rcond=None)[0]
    omnidepth = (a * omnidepth + b).astype(orig_depth.dtype)
    np.save(output_dir / f'{k}.npy', omnidepth)


def sdfstudio_preprocessing(scene_dir, mono_depth_folder, output_folder, depth_scale=1000.0):
  """preprocessing color, depth, mono_depth, pose, intrinsic; the scene is rescaled into a [-1, +1] cube."""
  keys = sorted(p.stem for p in (scene_dir / 'color').glob('*.npy'))
  poses = np.stack([np.loadtxt(scene_dir / 'pose' / f'{k}.txt') for k in keys], axis=0)
  intrinsics = np.stack([np.loadtxt(scene_dir / 'intrinsic' / f'{k}.txt') for k in keys], axis=0)
  min_vertices, max_vertices = poses[:, :3, 3].min(axis=0), poses[:, :3, 3].max(axis=0)
  center = (min_vertices + max_vertices) / 2.0
  scale = 2.0 / (np.max(max_vertices - min_vertices) + 3.0)
  poses[:, :3, 3] -= center
  poses[:, :3, 3] *= scale
  log.info(f" scaling poses into a unit cube, original center :{center}, original scale: {scale}")

  output_dir = scene_dir / output_folder
  shutil.rmtree(output_dir, ignore_errors=True)
  output_dir.mkdir(parents=True)
  frames = []
  for idx, (pose, intrinsic, k) in enumerate(zip(poses, intrinsics, keys)):
    np.save(output_dir / f"{idx:06d}_rgb.npy", np.load(scene_dir / 'color' / f'{k}.npy'))
    np.save(output_dir / f"{idx:06d}_sensor_depth.npy", np.load(scene_dir / 'depth' / f'{k}.npy') / depth_scale * scale)
    # process mono depth
    mono_depth = np.load(scene_dir / mono_depth_folder / f'{k}.npy').astype(np.float32)
    monodepth_tensor = torch.from_numpy(mono_depth)
    monodepth_tensor = monodepth_tensor - monodepth_tensor.min()
    monodepth_tensor = monodepth_tensor / monodepth_tensor.max()
    np.save(output_dir / f"{idx:06d}_depth.npy", np.asarray(monodepth_tensor))
    frames.append({"rgb_path": f"{idx:06d}_rgb.npy", "camtoworld": pose.tolist(),
                   "intrinsics": intrinsic.tolist(), "mono_depth_path": f"{idx:06d}_depth.npy"})
  meta = {"camera_model": "OPENCV", "height": IMAGE_SIZE, "width": IMAGE_SIZE, "has_mono_prior": True,
          "scene_box": {"aabb": [[-1, -1, -1], [1, 1, 1]], "near": 0.05, "far": 2.5, "radius": 1.0,
                        "collider_type": "near_far"}, "frames": frames}
  (output_dir / 'meta_data.json').write_text(json.dumps(meta))
  log.info(f" wrote {len(frames)} frames to {output_dir}")


class SDFStudioDataset:
  def __init__(self, data_dir):
    meta = json.loads((data_dir / 'meta_data.json').read_text())
    self.near, self.far = meta["scene_box"]["near"], meta["scene_box"]["far"]
    self.images = torch.stack([torch.from_numpy(np.load(data_dir / f["rgb_path"])) for f in meta["frames"]])
    self.depths = torch.stack([torch.from_numpy(np.load(data_dir / f["mono_depth_path"])) for f in meta["frames"]])
    self.c2w = torch.tensor([f["camtoworld"] for f in meta["frames"]], dtype=torch.float32)
    self.K = torch.tensor([f["intrinsics"] for f in meta["frames"]], dtype=torch.float32)

  def sample_rays(self, image_idx, num_rays, generator):
    pix = torch.randint(0, IMAGE_SIZE * IMAGE_SIZE, (num_rays,), generator=generator)
    v, u = (pix // IMAGE_SIZE).float() + 0.5, (pix % IMAGE_SIZE).float() + 0.5
    K, c2w = self.K[image_idx], self.c2w[image_idx]
    d_cam = torch.stack([(u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1], torch.ones_like(u)], -1)
    dirs = d_cam @ c2w[:3, :3].T
    return {"origins": c2w[:3, 3].expand(num_rays, 3), "directions": F.normalize(dirs, dim=-1),
            "directions_norm": dirs.norm(dim=-1), "image": self.images[image_idx].reshape(-1, 3)[pix],
            "depth": self.depths[image_idx].reshape(-1)[pix]}


class SDFField(torch.nn.Module):
  def __init__(self, hidden=64, feat=16, bias=0.6):
    super().__init__()
    self.l0, self.l1, self.l2 = torch.nn.Linear(3, hidden), torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, 1 + feat)
    for lin in (self.l0, self.l1):
      torch.nn.init.normal_(lin.weight, 0.0, np.sqrt(2) / np.sqrt(hidden))
      torch.nn.init.zeros_(lin.bias)
    # geometric init, inside_outside=True (indoor scene): sdf > 0 inside the unit sphere
    torch.nn.init.normal_(self.l2.weight, -np.sqrt(np.pi) / np.sqrt(hidden), 1e-4)
    torch.nn.init.constant_(self.l2.bias, bias)
    self.color = torch.nn.Sequential(torch.nn.Linear(3 + 3 + 3 + feat, hidden), torch.nn.ReLU(),
                                     torch.nn.Linear(hidden, 3), torch.nn.Sigmoid())
    self.beta = torch.nn.Parameter(torch.tensor(0.1))

  def forward(self, points, dirs):
    points.requires_grad_(True)
    h = F.softplus(self.l1(F.softplus(self.l0(points), beta=100)), beta=100)
    out = self.l2(h)
    sdf, feat = out[..., :1], out[..., 1:]
    grad = torch.autograd.grad(sdf, points, torch.ones_like(sdf), create_graph=True)[0]
    rgb = self.color(torch.cat([points, dirs, F.normalize(grad, dim=-1), feat], -1))
    beta = self.beta.abs() + 1e-4  # LaplaceDensity
    density = (1.0 / beta) * (0.5 + 0.5 * sdf.sign() * torch.expm1(-sdf.abs() / beta))
    return density, rgb, grad


def render(field, ray_bundle, near, far, num_samples=32):
  t = torch.linspace(near, far, num_samples)[None].expand(len(ray_bundle["origins"]), num_samples)
  points = ray_bundle["origins"][:, None] + t[..., None] * ray_bundle["directions"][:, None]
  density, rgb, grad = field(points, ray_bundle["directions"][:, None].expand_as(points))
  deltas = torch.cat([t[:, 1:] - t[:, :-1], torch.full_like(t[:, :1], 1e10)], -1)
  alpha = 1.0 - torch.exp(-density[..., 0] * deltas)
  trans = torch.cumprod(torch.cat([torch.ones_like(alpha[:, :1]), 1.0 - alpha + 1e-7], -1), -1)[:, :-1]
  weights = alpha * trans
  depth = (weights * t).sum(-1) / ray_bundle["directions_norm"]
  return {"rgb": (weights[..., None] * rgb).sum(1), "depth": depth, "eik_grad": grad}


def compute_scale_and_shift(prediction, target, mask):
  a_00 = torch.sum(mask * prediction * prediction, (1, 2))
  a_01 = torch.sum(mask * prediction, (1, 2))
  a_11 = torch.sum(mask, (1, 2))
  b_0 = torch.sum(mask * prediction * target, (1, 2))
  b_1 = torch.sum(mask * target, (1, 2))
  x_0, x_1 = torch.zeros_like(b_0), torch.zeros_like(b_1)
  det = a_00 * a_11 - a_01 * a_01
  valid = det.nonzero()
  x_0[valid] = (a_11[valid] * b_0[valid] - a_01[valid] * b_1[valid]) / det[valid]
  x_1[valid] = (-a_01[valid] * b_0[valid] + a_00[valid] * b_1[valid]) / det[valid]
  return x_0, x_1


def scale_and_shift_invariant_loss(prediction, target, mask, alpha=0.5):
  scale, shift = compute_scale_and_shift(prediction, target, mask)
  res = scale.view(-1, 1, 1) * prediction + shift.view(-1, 1, 1) - target
  data_loss = torch.sum(mask * res * res) / (2 * torch.sum(mask))
  grad_x = torch.abs(res[:, :, 1:] - res[:, :, :-1]) * mask[:, :, 1:] * mask[:, :, :-1]
  grad_y = torch.abs(res[:, 1:, :] - res[:, :-1, :]) * mask[:, 1:, :] * mask[:, :-1, :]
  return data_loss + alpha * (grad_x.sum() + grad_y.sum()) / torch.sum(mask)


def train(data_dir, max_num_iterations=100, num_rays=256, mono_depth_loss_mult=0.1, eikonal_loss_mult=0.1):
  dataset = SDFStudioDataset(data_dir)
  field = SDFField()
  optimizer = torch.optim.Adam(field.parameters(), lr=5e-4)
  generator = torch.Generator().manual_seed(0)
  for step in range(max_num_iterations):
    image_idx = int(torch.randint(0, len(dataset.images), (1,), generator=generator))
    batch = dataset.sample_rays(image_idx, num_rays, generator)
    outputs = render(field, batch, dataset.near, dataset.far)
    loss_dict = {"rgb_loss": F.l1_loss(outputs["rgb"], batch["image"]),
                 "eikonal_loss": ((outputs["eik_grad"].norm(2, dim=-1) - 1) ** 2).mean() * eikonal_loss_mult}
    depth_gt, depth_pred = batch["depth"], outputs["depth"]
    mask = torch.ones_like(depth_gt).reshape(1, 32, -1).bool()
    loss_dict["depth_loss"] = scale_and_shift_invariant_loss(
        depth_pred.reshape(1, 32, -1), (depth_gt * 50 + 0.5).reshape(1, 32, -1), mask) * mono_depth_loss_mult
    loss = sum(loss_dict.values())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0 or step == max_num_iterations - 1:
      print(f"Step {step:4d} ({100 * (step + 1) / max_num_iterations:5.1f}%)  image {image_idx:2d}  loss {loss.item():.4f}  "
            + "  ".join(f"{k} {v.item():.4f}" for k, v in loss_dict.items()))


def main():
  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  scene_dir = Path(tempfile.mkdtemp(prefix='labelmaker_scene_'))
  try:
    capture_scene(scene_dir, rng)
    run_omnidepth(scene_dir)
    sdfstudio_preprocessing(scene_dir, 'intermediate/depth_omnidata_1', 'intermediate/sdfstudio_preprocessing')
    train(scene_dir / 'intermediate/sdfstudio_preprocessing')
  finally:
    shutil.rmtree(scene_dir, ignore_errors=True)


if __name__ == '__main__':
  main()
