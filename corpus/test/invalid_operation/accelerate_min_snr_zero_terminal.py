"""Latent-diffusion style denoiser trained with Hugging Face Accelerate.

Epsilon-prediction objective on synthetic 4x8x8 "latents", a scaled-linear beta
schedule rescaled to zero terminal SNR (Lin et al. 2023) and Min-SNR-gamma loss
weighting (Hang et al. 2023), following the layout of the diffusers text-to-image
training scripts.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from accelerate import Accelerator
from accelerate.utils import set_seed


def parse_args():
    parser = argparse.ArgumentParser(description="Tiny latent denoiser with Min-SNR weighting")
    parser.add_argument("--num_train_timesteps", type=int, default=1000)
    parser.add_argument("--rescale_betas_zero_snr", type=int, default=1)
    parser.add_argument("--snr_gamma", type=float, default=5.0)
    parser.add_argument("--train_batch_size", type=int, default=16)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--max_train_steps", type=int, default=120)
    parser.add_argument("--learning_rate", type=float, default=3e-4)
    parser.add_argument("--lr_warmup_steps", type=int, default=20)
    parser.add_argument("--max_grad_norm", type=float, default=1.0)
    parser.add_argument("--mixed_precision", type=str, default="no")
    parser.add_argument("--seed", type=int, default=3)
    return parser.parse_args()


def rescale_zero_terminal_snr(betas):
    """Shift and scale sqrt(alphas_cumprod) so that the last timestep has SNR exactly 0."""
    alphas_bar_sqrt = torch.cumprod(1.0 - betas, dim=0).sqrt()
    first = alphas_bar_sqrt[0].clone()
    last = alphas_bar_sqrt[-1].clone()
    alphas_bar_sqrt = alphas_bar_sqrt - last
    alphas_bar_sqrt = alphas_bar_sqrt * first / (first - last)
    alphas_bar = alphas_bar_sqrt ** 2
    alphas = torch.cat([alphas_bar[0:1], alphas_bar[1:] / alphas_bar[:-1]])
    return 1.0 - alphas


class NoiseSchedule:
    def __init__(self, num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, zero_snr=True):
        betas = torch.linspace(beta_start ** 0.5, beta_end ** 0.5, num_train_timesteps, dtype=torch.float32) ** 2
        if zero_snr:
            betas = rescale_zero_terminal_snr(betas)
        self.num_train_timesteps = num_train_timesteps
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)

    def add_noise(self, latents, noise, timesteps):
        sqrt_alpha = self.alphas_cumprod[timesteps].sqrt().view(-1, 1, 1, 1)
        sqrt_one_minus_alpha = (1.0 - self.alphas_cumprod[timesteps]).sqrt().view(-1, 1, 1, 1)
        return sqrt_alpha * latents + sqrt_one_minus_alpha * noise


def compute_snr(schedule, timesteps):
    alphas_cumprod = schedule.alphas_cumprod.to(timesteps.device)
    alpha = alphas_cumprod[timesteps] ** 0.5
    sigma = (1.0 - alphas_cumprod[timesteps]) ** 0.5
    return (alpha / sigma) ** 2


class SyntheticLatents(Dataset):
    """Smooth 4-channel fields standing in for VAE latents of 64x64 images."""

    def __init__(self, n=512, seed=0):
        g = torch.Generator().manual_seed(seed)
        yy, xx = torch.meshgrid(torch.linspace(-1, 1, 8), torch.linspace(-1, 1, 8), indexing="ij")
        freqs = torch.rand(n, 4, 2, generator=g) * 3.0
        phase = torch.rand(n, 4, 1, 1, generator=g) * 6.28
        self.latents = torch.sin(freqs[..., 0, None, None] * xx + freqs[..., 1, None, None] * yy + phase)

    def __len__(self):
        return self.latents.shape[0]

    def __getitem__(self, idx):
        return {"latents": self.latents[idx]}


def timestep_embedding(timesteps, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=timesteps.device) / half)
    args = timesteps.float()[:, None] * freqs[None]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)


class TinyUNet(nn.Module):
    def __init__(self, channels=4, hidden=32, temb_dim=32):
        super().__init__()
        self.temb_dim = temb_dim
        self.time_mlp = nn.Sequential(nn.Linear(temb_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.conv_in = nn.Conv2d(channels, hidden, 3, padding=1)
        self.down = nn.Conv2d(hidden, hidden, 3, stride=2, padding=1)
        self.mid = nn.Sequential(nn.GroupNorm(8, hidden), nn.SiLU(), nn.Conv2d(hidden, hidden, 3, padding=1))
        self.up = nn.ConvTranspose2d(hidden, hidden, 4, stride=2, padding=1)
        self.out = nn.Sequential(nn.GroupNorm(8, 2 * hidden), nn.SiLU(), nn.Conv2d(2 * hidden, channels, 3, padding=1))

    def forward(self, sample, timesteps):
        temb = self.time_mlp(timestep_embedding(timesteps, self.temb_dim))
        h0 = F.silu(self.conv_in(sample)) + temb[:, :, None, None]
        h = self.mid(self.down(h0))
        h = self.up(h)
        return self.out(torch.cat([h, h0], dim=1))


def main():
    args = parse_args()
    accelerator = Accelerator(
        cpu=True,
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
    )
    set_seed(args.seed)

    noise_scheduler = NoiseSchedule(args.num_train_timesteps, zero_snr=bool(args.rescale_betas_zero_snr))
    unet = TinyUNet()
    optimizer = torch.optim.AdamW(unet.parameters(), lr=args.learning_rate, weight_decay=1e-2)
    train_dataloader = DataLoader(SyntheticLatents(), batch_size=args.train_batch_size, shuffle=True, drop_last=True)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / args.lr_warmup_steps)
    )

    unet, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        unet, optimizer, train_dataloader, lr_scheduler
    )

    global_step = 0
    train_loss = 0.0
    while global_step < args.max_train_steps:
        unet.train()
        for batch in train_dataloader:
            with accelerator.accumulate(unet):
                latents = batch["latents"]
                noise = torch.randn_like(latents)
                bsz = latents.shape[0]
                timesteps = torch.randint(0, noise_scheduler.num_train_timesteps, (bsz,), device=latents.device)
                noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)

                model_pred = unet(noisy_latents, timesteps)
                target = noise

                if args.snr_gamma is None:
                    loss = F.mse_loss(model_pred.float(), target.float(), reduction="mean")
                else:
                    snr = compute_snr(noise_scheduler, timesteps)
                    mse_loss_weights = torch.stack([snr, args.snr_gamma * torch.ones_like(timesteps)], dim=1).min(dim=1)[0] / snr
                    loss = F.mse_loss(model_pred.float(), target.float(), reduction="none")
                    loss = loss.mean(dim=list(range(1, len(loss.shape)))) * mse_loss_weights
                    loss = loss.mean()

                train_loss += loss.detach().item() / args.gradient_accumulation_steps
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(unet.parameters(), args.max_grad_norm)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

            if accelerator.sync_gradients:
                global_step += 1
                if global_step % 10 == 0 or global_step == 1:
                    accelerator.print(
                        f"step {global_step:4d}  loss {train_loss:.5f}  lr {lr_scheduler.get_last_lr()[0]:.2e}"
                    )
                train_loss = 0.0
                if global_step >= args.max_train_steps:
                    break

    accelerator.print("training finished")


if __name__ == "__main__":
    main()
