"""Magnitude-mask speech enhancement (MP-SENet-style data pipeline) on a small
VoiceBank+DEMAND-like set of synthetic wav files.

The Dataset RMS-normalises every (clean, noisy) pair with
    norm_factor = sqrt(len(noisy) / sum(noisy ** 2))
One of the 300 noisy recordings is pure digital silence (the recorder produced an
all-zero file), so sum(noisy ** 2) == 0, norm_factor = inf and 0 * inf = NaN for every
sample of that pair.  The first batch that contains it gives a NaN loss and NaN
weights; the run is fine up to then.

Reproduces: https://github.com/yxlu-0102/MP-SENet/issues/33
("Error dividing by zero if noisy_audio is silence": np.max(noisy) == 0 -> NaN loss;
the suggested fix, acknowledged by the author, is to handle the silent clip in
dataset.py before the normalisation).
Fix: add tiny noise to an all-zero noisy clip (or skip it) before computing
norm_factor, e.g. `if noisy_audio.abs().max() == 0: noisy_audio += 1e-5 * torch.randn_like(noisy_audio)`.
"""
import os
import random
import tempfile
import wave

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

SR = 16000
N_FFT, HOP, WIN = 400, 100, 400
SEGMENT = 8000
COMPRESS = 0.3


def write_wav(path, audio):
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    with wave.open(path, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(SR)
        f.writeframes(pcm.tobytes())


def read_wav(path):
    with wave.open(path, "rb") as f:
        pcm = np.frombuffer(f.readframes(f.getnframes()), dtype=np.int16)
    return pcm.astype(np.float32) / 32768.0


def build_corpus(root, n_files=300, silent=(166,)):
    """Synthetic 'utterances': a few voiced syllables (harmonic stacks) + babble/white noise."""
    rng = np.random.default_rng(1234)
    os.makedirs(os.path.join(root, "wavs_clean"))
    os.makedirs(os.path.join(root, "wavs_noisy"))
    names = []
    for i in range(n_files):
        name = f"p{226 + i % 30}_{i:03d}"
        n = int(SR * rng.uniform(0.8, 1.4))
        t = np.arange(n) / SR
        clean = np.zeros(n)
        for _ in range(rng.integers(2, 5)):
            start, dur = rng.integers(0, n - 2000), rng.integers(1500, 4000)
            f0 = rng.uniform(100, 240)
            env = np.zeros(n)
            env[start:start + dur] = np.hanning(len(env[start:start + dur]))
            clean += env * sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6))
        clean *= 0.3 / (np.abs(clean).max() + 1e-9)
        noise = rng.normal(0, 1, n) * rng.uniform(0.02, 0.08)
        noisy = clean + noise
        if i in silent:
            clean, noisy = np.zeros(n), np.zeros(n)
        write_wav(os.path.join(root, "wavs_clean", name + ".wav"), clean)
        write_wav(os.path.join(root, "wavs_noisy", name + ".wav"), noisy)
        names.append(name)
    with open(os.path.join(root, "training.txt"), "w") as f:
        f.write("\n".join(f"{nm}|dummy transcript" for nm in names))
    return os.path.join(root, "training.txt")


def mag_pha_stft(y):
    window = torch.hann_window(WIN)
    spec = torch.stft(y, N_FFT, hop_length=HOP, win_length=WIN, window=window, center=True,
                      pad_mode="reflect", normalized=False, return_complex=True)
    spec = torch.view_as_real(spec)
    mag = torch.sqrt(spec.pow(2).sum(-1) + 1e-9)
    pha = torch.atan2(spec[..., 1] + 1e-10, spec[..., 0] + 1e-5)
    mag = torch.pow(mag, COMPRESS)
    return mag, pha


class VoiceBankDataset(Dataset):
    def __init__(self, index_file, clean_dir, noisy_dir, segment_size):
        with open(index_file, encoding="utf-8") as fi:
            self.audio_indexes = [x.split("|")[0] for x in fi.read().split("\n") if len(x) > 0]
        self.clean_dir, self.noisy_dir = clean_dir, noisy_dir
        self.segment_size = segment_size

    def __len__(self):
        return len(self.audio_indexes)

    def __getitem__(self, index):
        name = self.audio_indexes[index]
        clean_audio = torch.FloatTensor(read_wav(os.path.join(self.clean_dir, name + ".wav")))
        noisy_audio = torch.FloatTensor(read_wav(os.path.join(self.noisy_dir, name + ".wav")))
        norm_factor = torch.sqrt(len(noisy_audio) / torch.sum(noisy_audio ** 2.0))
        clean_audio = (clean_audio * norm_factor).unsqueeze(0)
        noisy_audio = (noisy_audio * norm_factor).unsqueeze(0)

        if clean_audio.size(1) >= self.segment_size:
            start = random.randint(0, clean_audio.size(1) - self.segment_size)
            clean_audio = clean_audio[:, start:start + self.segment_size]
            noisy_audio = noisy_audio[:, start:start + self.segment_size]
        else:
            pad = self.segment_size - clean_audio.size(1)
            clean_audio = F.pad(clean_audio, (0, pad))
            noisy_audio = F.pad(noisy_audio, (0, pad))
        return clean_audio.squeeze(0), noisy_audio.squeeze(0)


class MaskEstimator(nn.Module):
    """Small conv encoder on the compressed magnitude -> bounded mask."""

    def __init__(self, ch=16):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, ch, 3, padding=1), nn.PReLU(ch),
            nn.Conv2d(ch, ch, 3, padding=(2, 1), dilation=(2, 1)), nn.PReLU(ch),
            nn.Conv2d(ch, ch, 3, padding=(4, 1), dilation=(4, 1)), nn.PReLU(ch),
            nn.Conv2d(ch, 1, 1),
        )

    def forward(self, noisy_mag):
        mask = 1.2 * torch.sigmoid(self.net(noisy_mag.unsqueeze(1)).squeeze(1))
        return noisy_mag * mask


def train(tmp):
    torch.manual_seed(1234)
    random.seed(1234)
    index_file = build_corpus(tmp)
    trainset = VoiceBankDataset(index_file, os.path.join(tmp, "wavs_clean"), os.path.join(tmp, "wavs_noisy"), SEGMENT)
    loader = DataLoader(trainset, batch_size=4, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(1234))

    model = MaskEstimator()
    optim = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.8, 0.99))

    step = 0
    for epoch in range(2):
        for clean_audio, noisy_audio in loader:
            clean_mag, clean_pha = mag_pha_stft(clean_audio)
            noisy_mag, noisy_pha = mag_pha_stft(noisy_audio)
            mag_g = model(noisy_mag)
            loss_mag = F.mse_loss(mag_g, clean_mag)
            com_g = torch.stack((mag_g * torch.cos(noisy_pha), mag_g * torch.sin(noisy_pha)), -1)
            com_c = torch.stack((clean_mag * torch.cos(clean_pha), clean_mag * torch.sin(clean_pha)), -1)
            loss_com = F.mse_loss(com_g, com_c) * 2
            loss = 0.9 * loss_mag + 0.1 * loss_com

            optim.zero_grad()
            loss.backward()
            optim.step()
            if step % 10 == 0:
                print(f"Epoch {epoch} Steps {step:4d} Gen Loss Total {loss.item():.4f} "
                      f"Magnitude Loss {loss_mag.item():.4f}")
            step += 1


def main():
    with tempfile.TemporaryDirectory(prefix="vbd_") as tmp:
        train(tmp)


if __name__ == "__main__":
    main()
