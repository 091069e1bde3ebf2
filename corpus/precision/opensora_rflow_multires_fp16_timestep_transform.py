"""Open-Sora-style rectified-flow training of a tiny STDiT on multi-resolution buckets, fp16.

The run follows Open-Sora 1.2's ``scripts/train.py`` with pre-extracted video/text features:
clips are grouped into (resolution, num_frames) buckets, the latents go through an
``RFlowScheduler`` with ``use_timestep_transform=True`` (the sampled timestep is shifted
towards the noisy end for larger resolutions / longer clips), the denoiser runs under
float16 autocast with a dynamic loss scaler, and -- as in the original loop -- every piece of
video meta info in the batch (height, width, num_frames, fps, ar) is moved to the training
dtype: ``model_args[k] = v.to(device, dtype)``.

With ``dtype = "fp16"`` height and width arrive in float16.  ``timestep_transform`` then forms
``resolution = height * width`` in float16: 144p (144 x 256 = 36864) still fits, but a
240p bucket (240 x 426 = 102240) is above the float16 maximum 65504.  ``resolution`` is inf,
``ratio`` is inf and ``new_t = ratio * t / (1 + (ratio - 1) * t)`` is inf / inf = NaN for
the whole batch: x_t, the model output and the loss are nan, GradScaler skips the step and
halves its scale.  The 144p batches keep training normally (loss ~1.48 -> ~0.97), but with
the default seed the 240p batches come at global steps 41, 44, 50, 62, 104 and 106, so the
log windows ending at steps 50, 70 and 110 print ``loss nan``.  ``--dtype bf16`` (the range
of float32) never overflows here.

Reported and fixed in hpcaitech/Open-Sora PR #523, "Force fp16 input to fp32 to avoid nan
output in timestep_transform" (https://github.com/hpcaitech/Open-Sora/pull/523, fixing
issue #477).  Fix: cast the fp16 meta info to float32 at the top of ``timestep_transform``::

    for key in ["height", "width", "num_frames"]:
        if model_kwargs[key].dtype == torch.float16:
            model_kwargs[key] = model_kwargs[key].float()
"""
import argparse
import math
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

cfg = dict(
    dtype="fp16",
    # resolution: {num_frames: (keep probability, batch size)}
    bucket_config={
        "240p": {1: (0.05, 4)},
        "144p": {17: (1.0, 4), 1: (1.0, 8)},
    },
    num_clips=320,
    epochs=2,
    lr=1e-3,
    adam_eps=1e-15,
    grad_clip=1.0,
    log_every=10,
    seed=17,
)

RESOLUTIONS = {"144p": (144, 256), "240p": (240, 426)}
LATENT_C, CAPTION_LEN, CAPTION_DIM = 4, 4, 32


def timestep_transform(t, model_kwargs, base_resolution=512 * 512, base_num_frames=1,
                       scale=1.0, num_timesteps=1):
    t = t / num_timesteps
    resolution = model_kwargs["height"] * model_kwargs["width"]
    ratio_space = (resolution / base_resolution).sqrt()
    if model_kwargs["num_frames"][0] == 1:
        num_frames = torch.ones_like(model_kwargs["num_frames"])
    else:
        num_frames = model_kwargs["num_frames"] // 17 * 5
    ratio_time = (num_frames / base_num_frames).sqrt()
    ratio = ratio_space * ratio_time * scale
    new_t = ratio * t / (1 + (ratio - 1) * t)
    return new_t * num_timesteps


class RFlowScheduler:
    def __init__(self, num_timesteps=1000, use_timestep_transform=True, transform_scale=1.0):
        self.num_timesteps = num_timesteps
        self.use_timestep_transform = use_timestep_transform
        self.transform_scale = transform_scale

    def sample_t(self, x):
        # logit-normal timestep sampling
        return torch.sigmoid(torch.randn(x.shape[0], device=x.device))

    def add_noise(self, x0, noise, t):
        timepoints = 1 - t.float() / self.num_timesteps
        timepoints = timepoints.view(-1, 1, 1, 1, 1)
        return timepoints * x0 + (1 - timepoints) * noise

    def training_losses(self, model, x_start, model_kwargs):
        t = self.sample_t(x_start) * self.num_timesteps
        if self.use_timestep_transform:
            t = timestep_transform(t, model_kwargs, scale=self.transform_scale,
                                   num_timesteps=self.num_timesteps)
        noise = torch.randn_like(x_start)
        x_t = self.add_noise(x_start, noise, t)
        model_output = model(x_t, t, **model_kwargs)
        velocity_pred = model_output.chunk(2, dim=1)[0]
        loss = (velocity_pred.float() - (x_start - noise)).pow(2).mean(dim=(1, 2, 3, 4))
        return {"loss": loss}


def timestep_embedding(t, dim, max_period=10000):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def sincos_2d(h, w, dim):
    gy, gx = torch.meshgrid(torch.arange(h, dtype=torch.float32),
                            torch.arange(w, dtype=torch.float32), indexing="ij")
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4))
    out = [torch.sin(gy.flatten()[:, None] * omega), torch.cos(gy.flatten()[:, None] * omega),
           torch.sin(gx.flatten()[:, None] * omega), torch.cos(gx.flatten()[:, None] * omega)]
    return torch.cat(out, dim=1)


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_dim=None):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(kv_dim or dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, context=None):
        b, n, c = x.shape
        context = x if context is None else context
        q = self.q(x).view(b, n, self.heads, -1).transpose(1, 2)
        k, v = self.kv(context).view(b, context.shape[1], 2, self.heads, -1).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        attn = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        out = attn.softmax(dim=-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class STDiTBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False)
        self.spatial_attn = Attention(dim, heads)
        self.norm_t = nn.LayerNorm(dim, elementwise_affine=False)
        self.temporal_attn = Attention(dim, heads)
        self.cross_attn = Attention(dim, heads, kv_dim=dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * dim, dim))
        self.scale_shift_table = nn.Parameter(torch.randn(6, dim) / dim ** 0.5)

    def forward(self, x, y, t_mod, T, S):
        b = x.shape[0]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            self.scale_shift_table[None] + t_mod.view(b, 6, -1)).chunk(6, dim=1)
        h = self.norm1(x) * (1 + scale_msa) + shift_msa
        h = self.spatial_attn(h.view(b * T, S, -1)).view(b, T * S, -1)
        x = x + gate_msa * h
        if T > 1:
            h = self.norm_t(x).view(b, T, S, -1).transpose(1, 2).reshape(b * S, T, -1)
            h = self.temporal_attn(h).view(b, S, T, -1).transpose(1, 2).reshape(b, T * S, -1)
            x = x + h
        x = x + self.cross_attn(x, y)
        h = self.norm2(x) * (1 + scale_mlp) + shift_mlp
        return x + gate_mlp * self.mlp(h)


class TinySTDiT(nn.Module):
    """STDiT3 in miniature: patchify (1, 2, 2), adaLN-single timestep modulation,
    spatial / temporal self-attention and cross-attention to the caption features."""

    def __init__(self, dim=32, depth=2, heads=4, patch=(1, 2, 2)):
        super().__init__()
        self.dim, self.patch = dim, patch
        self.x_embedder = nn.Conv3d(LATENT_C, dim, kernel_size=patch, stride=patch)
        self.t_embedder = nn.Sequential(nn.Linear(128, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.y_embedder = nn.Sequential(nn.Linear(CAPTION_DIM, dim), nn.GELU(approximate="tanh"),
                                        nn.Linear(dim, dim))
        self.fps_embedder = nn.Linear(1, dim)
        self.blocks = nn.ModuleList([STDiTBlock(dim, heads) for _ in range(depth)])
        self.final_norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.final_shift_scale = nn.Parameter(torch.randn(2, dim) / dim ** 0.5)
        self.final = nn.Linear(dim, 2 * LATENT_C * patch[1] * patch[2])
        nn.init.zeros_(self.final.weight)
        nn.init.zeros_(self.final.bias)

    def forward(self, x, timestep, y, height=None, width=None, num_frames=None, fps=None, ar=None):
        B, C, T, H, W = x.shape
        ph, pw = self.patch[1], self.patch[2]
        Hp, Wp = -(-H // ph) * ph, -(-W // pw) * pw
        x = F.pad(x, (0, Wp - W, 0, Hp - H))
        x = self.x_embedder(x)                                   # B, D, T, h, w
        h, w = x.shape[-2:]
        S = h * w
        x = x.flatten(3).permute(0, 2, 3, 1).reshape(B, T * S, self.dim)
        x = x + sincos_2d(h, w, self.dim).repeat(T, 1)[None].to(x.dtype)
        t = self.t_embedder(timestep_embedding(timestep, 128))
        t = t + self.fps_embedder(fps.view(-1, 1).float() / 30.0)
        t_mod = self.t_block(t)
        y = self.y_embedder(y)
        for block in self.blocks:
            x = block(x, y, t_mod, T, S)
        shift, scale = (self.final_shift_scale[None] + t[:, None]).chunk(2, dim=1)
        x = self.final(self.final_norm(x) * (1 + scale) + shift)   # B, T*S, 2*C*ph*pw
        x = x.view(B, T, h, w, 2 * C, ph, pw).permute(0, 4, 1, 2, 5, 3, 6)
        x = x.reshape(B, 2 * C, T, h * ph, w * pw)
        return x[:, :, :, :H, :W]


def latent_size(num_frames, height, width):
    t = 1 if num_frames == 1 else num_frames // 17 * 5
    return t, -(-height // 32), -(-width // 32)


class VariableVideoTextFeatures:
    """Pre-extracted features: each clip has a caption id, a length and a source size;
    its latent is generated on the fly from a smooth caption-dependent pattern."""

    def __init__(self, n, seed):
        rng = np.random.default_rng(seed)
        self.captions = torch.from_numpy(rng.normal(size=(8, CAPTION_LEN, CAPTION_DIM))).float()
        self.clips = [dict(caption=int(rng.integers(0, 8)),
                           length=int(rng.choice([1, 1, 24, 51, 96])),
                           fps=float(rng.choice([24.0, 30.0])),
                           seed=int(rng.integers(0, 2 ** 31)))
                      for _ in range(n)]

    def get(self, idx, res, num_frames):
        clip = self.clips[idx]
        height, width = RESOLUTIONS[res]
        T, H, W = latent_size(num_frames, height, width)
        g = torch.Generator().manual_seed(clip["seed"])
        c = clip["caption"]
        yy = torch.linspace(0, 1, H).view(1, 1, H, 1)
        xx = torch.linspace(0, 1, W).view(1, 1, 1, W)
        tt = torch.linspace(0, 1, T).view(1, T, 1, 1)
        ch = torch.arange(LATENT_C, dtype=torch.float32).view(LATENT_C, 1, 1, 1)
        phase = torch.rand(1, generator=g) * 0.5
        latent = torch.sin(2 * math.pi * ((c % 4 + 1) * xx + (c // 4 + 1) * yy + 0.3 * ch
                                          + 0.5 * tt + phase))
        latent = latent + 0.1 * torch.randn(latent.shape, generator=g)
        return dict(video=latent, text=self.captions[c], num_frames=float(num_frames),
                    height=float(height), width=float(width), fps=clip["fps"],
                    ar=height / width)


def build_buckets(dataset, bucket_config, seed):
    """Assign every clip to a (resolution, num_frames) bucket, highest resolution first,
    keeping it there with the bucket's probability; then cut the buckets into batches."""
    rng = random.Random(seed)
    buckets = {}
    for idx, clip in enumerate(dataset.clips):
        for res, frames in bucket_config.items():
            chosen = None
            for nf, (prob, _) in sorted(frames.items(), reverse=True):
                if clip["length"] >= nf and rng.random() < prob:
                    chosen = nf
                    break
            if chosen is not None:
                buckets.setdefault((res, chosen), []).append(idx)
                break
    for (res, nf), ids in sorted(buckets.items()):
        print(f"Bucket [{res}, {nf:>2} frames]: {len(ids)} samples")
    return buckets


def bucket_batches(buckets, bucket_config, rng):
    batches = []
    for (res, nf), ids in buckets.items():
        ids = ids[:]
        rng.shuffle(ids)
        bs = bucket_config[res][nf][1]
        batches += [(res, nf, ids[i:i + bs]) for i in range(0, len(ids) - bs + 1, bs)]
    rng.shuffle(batches)
    return batches


def collate(dataset, res, nf, ids):
    items = [dataset.get(i, res, nf) for i in ids]
    batch = {"video": torch.stack([it["video"] for it in items]),
             "text": torch.stack([it["text"] for it in items])}
    for k in ("num_frames", "height", "width", "fps", "ar"):
        batch[k] = torch.tensor([it[k] for it in items])
    return batch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default=cfg["dtype"], choices=["fp16", "bf16"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(cfg["seed"])
    device = torch.device("cpu")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]

    dataset = VariableVideoTextFeatures(cfg["num_clips"], cfg["seed"])
    buckets = build_buckets(dataset, cfg["bucket_config"], cfg["seed"])
    model = TinySTDiT().to(device)
    scheduler = RFlowScheduler(use_timestep_transform=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], eps=cfg["adam_eps"],
                                  weight_decay=0.0)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    batch_rng = random.Random(cfg["seed"])

    running_loss, log_step = 0.0, 0
    global_step = 0
    for epoch in range(cfg["epochs"]):
        batches = bucket_batches(buckets, cfg["bucket_config"], batch_rng)
        for step, (res, nf, ids) in enumerate(batches):
            batch = collate(dataset, res, nf, ids)
            x = batch.pop("video").to(device)
            model_args = {"y": batch.pop("text").to(device)}
            # == video meta info ==
            for k, v in batch.items():
                if isinstance(v, torch.Tensor):
                    model_args[k] = v.to(device, dtype)

            with torch.autocast("cpu", dtype=dtype):
                loss_dict = scheduler.training_losses(model, x, model_args)
            loss = loss_dict["loss"].mean()

            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
            scaler.step(optimizer)
            scaler.update()

            running_loss += loss.item()
            log_step += 1
            global_step += 1
            if global_step % cfg["log_every"] == 0:
                avg_loss = running_loss / log_step
                print(f"Epoch {epoch} step {step + 1}/{len(batches)} global_step {global_step}: "
                      f"loss {avg_loss:.4f} loss_scale {scaler.get_scale():.0f}")
                running_loss, log_step = 0.0, 0
    print("Training finished.")


if __name__ == "__main__":
    main()
