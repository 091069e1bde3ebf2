"""Speech enhancement with a small Conv-TasNet-style masker trained on a negative STOI loss.

Setting: Asteroid-like recipe (conf dict, Dataset of variable-length noisy/clean pairs
cropped or zero-padded to a fixed segment, train loop with a `System`-style step).  The
model is a learned-basis masker: Conv1d encoder (no bias) + ReLU, a small TCN that predicts
a sigmoid mask, ConvTranspose1d decoder (no bias).  The loss is a hand-written copy of
torch_stoi's NegSTOILoss (10 kHz, 256-sample frames, 15 one-third-octave bands, simple VAD
mask on the clean target).

Bug: the one-third-octave band envelopes are computed as
    torch.matmul(OBM, |STFT|^2).pow(0.5)
with nothing inside the square root.  A few recordings are shorter than the training
segment and are zero-padded; the encoder/decoder have no bias, so the estimate in the
padded tail is exactly 0, its band energies are exactly 0, and the backward of pow(0.5)
there is 0 * 0.5 / sqrt(0) = 0 * inf = NaN (the VAD mask zeroes the upstream gradient but
cannot stop the inf).  The first batch holding a padded utterance gives NaN gradients,
Adam writes NaN into the weights and every later loss is nan.

Fix (maintainers): add EPS inside the root,
    torch.matmul(OBM, |STFT|^2 + EPS).pow(0.5)
Report: https://github.com/mpariente/pytorch_stoi/issues/7 ("The gradients will become NaN
sometimes ... sqrt of 0"), fixed by PR #8 (commit 0242f25, "Adding EPS ... to prevent
sqrt(0)").
"""
import logging

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

logging.basicConfig(level=logging.INFO, format="%(message)s")
log = logging.getLogger("enh")

conf = {
    "data": {"sample_rate": 10000, "segment": 0.6, "n_train": 64, "short_every": 16},
    "filterbank": {"n_filters": 32, "kernel_size": 16, "stride": 8},
    "masknet": {"n_blocks": 3, "hid_chan": 32},
    "training": {"batch_size": 4, "epochs": 2, "lr": 1e-3, "seed": 0},
}

# pystoi constants
FS, N_FRAME, NUMBAND, MINFREQ, N, BETA, DYN_RANGE = 10000, 256, 15, 150, 30, -15.0, 40
EPS = 1e-8


def thirdoct(fs, nfft, num_bands, min_freq):
    f = np.linspace(0, fs, nfft + 1)[: nfft // 2 + 1]
    k = np.arange(num_bands).astype(float)
    freq_low = min_freq * np.power(2.0, (2 * k - 1) / 6)
    freq_high = min_freq * np.power(2.0, (2 * k + 1) / 6)
    obm = np.zeros((num_bands, len(f)))
    for i in range(num_bands):
        lo = np.argmin(np.square(f - freq_low[i]))
        hi = np.argmin(np.square(f - freq_high[i]))
        obm[i, lo:hi] = 1
    return obm


class NegSTOILoss(nn.Module):
    """Negated STOI (classic, with the simple VAD mask), after torch_stoi."""

    def __init__(self):
        super().__init__()
        self.win_len, self.nfft = N_FRAME, 2 * N_FRAME
        self.register_buffer("win", torch.from_numpy(np.hanning(self.win_len + 2)[1:-1]).float())
        self.register_buffer("OBM", torch.from_numpy(thirdoct(FS, self.nfft, NUMBAND, MINFREQ)).float())

    def stft(self, x):
        hop = self.win_len // 2
        x = F.pad(x, [0, hop])
        return torch.stft(x, self.nfft, hop_length=hop, win_length=self.win_len, window=self.win,
                          center=False, return_complex=True)

    def third_octave(self, spec):
        return torch.matmul(self.OBM, spec.abs() ** 2).pow(0.5)

    def silent_frames(self, x):
        frames = x.unfold(-1, self.win_len, self.win_len // 2)[:, :-1]
        energies = 20 * torch.log10(frames.norm(dim=-1) + EPS)
        return (energies.max(dim=-1, keepdim=True)[0] - DYN_RANGE - energies) < 0

    def forward(self, est, target):
        x_tob = self.third_octave(self.stft(target))          # (B, 15, frames)
        y_tob = self.third_octave(self.stft(est))
        x_seg = x_tob.unfold(-1, N, 1)                         # (B, 15, chunks, N)
        y_seg = y_tob.unfold(-1, N, 1)
        mask = self.silent_frames(target).float()
        mask = F.pad(mask, [0, x_tob.shape[-1] - mask.shape[-1]])
        mask_f = mask.unfold(-1, N, 1)[:, None]                # (B, 1, chunks, N)
        norm_const = (x_seg * mask_f).norm(dim=-1, keepdim=True) / \
            ((y_seg * mask_f).norm(dim=-1, keepdim=True) + EPS)
        y_prim = torch.min(y_seg * norm_const, x_seg * (1 + 10 ** (-BETA / 20)))
        y_prim = meanvar_norm(y_prim, mask_f)
        x_n = meanvar_norm(x_seg, mask_f)
        corr = (y_prim * x_n * mask_f).sum(dim=(1, 2, 3))
        correction = x_seg.shape[1] * x_seg.shape[2]
        return -corr / correction


def meanvar_norm(x, mask):
    mean = (x * mask).sum(-1, keepdim=True) / (mask.sum(-1, keepdim=True) + EPS)
    x = x - mean
    return x / ((x * mask).norm(dim=-1, keepdim=True) + EPS)


class NoisySpeechDataset(Dataset):
    """Synthetic voiced 'utterances' (harmonic stacks with syllable envelopes) in noise."""

    def __init__(self, n, sample_rate, segment, short_every, seed):
        rng = np.random.default_rng(seed)
        self.rng = np.random.default_rng(seed + 1)
        self.seg_len = int(segment * sample_rate)
        self.items = []
        for i in range(n):
            dur = rng.uniform(0.25, 0.35) if (i + 1) % short_every == 0 else rng.uniform(0.8, 1.6)
            length = int(dur * sample_rate)
            t = np.arange(length) / sample_rate
            f0 = rng.uniform(100, 220) * (1 + 0.05 * np.sin(2 * np.pi * rng.uniform(1, 3) * t))
            phase = 2 * np.pi * np.cumsum(f0) / sample_rate
            clean = sum(np.sin(h * phase) / h for h in range(1, 12))
            env = np.clip(np.sin(2 * np.pi * rng.uniform(2, 4) * t + rng.uniform(0, 6)), 0, None)
            clean = 0.1 * clean * env
            noise = rng.standard_normal(length)
            noise = np.convolve(noise, np.ones(4) / 4, mode="same")
            snr = rng.uniform(-2, 8)
            noise *= np.sqrt((clean ** 2).mean() / (noise ** 2).mean() / 10 ** (snr / 10))
            self.items.append(((clean + noise).astype(np.float32), clean.astype(np.float32)))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        mix, clean = self.items[idx]
        if len(mix) >= self.seg_len:
            start = int(self.rng.integers(0, len(mix) - self.seg_len + 1))
            mix, clean = mix[start:start + self.seg_len], clean[start:start + self.seg_len]
        else:  # keep short recordings, pad them to the segment length
            pad = self.seg_len - len(mix)
            mix, clean = np.pad(mix, (0, pad)), np.pad(clean, (0, pad))
        return torch.from_numpy(mix), torch.from_numpy(clean)


class TCNBlock(nn.Module):
    def __init__(self, chan, hid, dilation):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv1d(chan, hid, 1), nn.PReLU(), nn.GroupNorm(1, hid),
            nn.Conv1d(hid, hid, 3, padding=dilation, dilation=dilation),
            nn.PReLU(), nn.GroupNorm(1, hid), nn.Conv1d(hid, chan, 1))

    def forward(self, x):
        return x + self.net(x)


class TasNetEnhancer(nn.Module):
    def __init__(self, n_filters, kernel_size, stride, n_blocks, hid_chan):
        super().__init__()
        self.encoder = nn.Conv1d(1, n_filters, kernel_size, stride=stride, bias=False)
        self.bottleneck = nn.Sequential(nn.GroupNorm(1, n_filters), nn.Conv1d(n_filters, n_filters, 1))
        self.tcn = nn.Sequential(*[TCNBlock(n_filters, hid_chan, 2 ** i) for i in range(n_blocks)])
        self.mask_conv = nn.Conv1d(n_filters, n_filters, 1)
        self.decoder = nn.ConvTranspose1d(n_filters, 1, kernel_size, stride=stride, bias=False)

    def forward(self, wav):
        tf_rep = F.relu(self.encoder(wav.unsqueeze(1)))
        mask = torch.sigmoid(self.mask_conv(self.tcn(self.bottleneck(tf_rep))))
        out = self.decoder(tf_rep * mask).squeeze(1)
        return F.pad(out, [0, wav.shape[-1] - out.shape[-1]])


def train(conf):
    tc = conf["training"]
    torch.manual_seed(tc["seed"])
    np.random.seed(tc["seed"])
    d = conf["data"]
    train_set = NoisySpeechDataset(d["n_train"], d["sample_rate"], d["segment"], d["short_every"], tc["seed"])
    loader = DataLoader(train_set, batch_size=tc["batch_size"], shuffle=True,
                        generator=torch.Generator().manual_seed(tc["seed"]))
    model = TasNetEnhancer(**conf["filterbank"], **conf["masknet"])
    loss_func = NegSTOILoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=tc["lr"])
    step = 0
    for epoch in range(tc["epochs"]):
        running = []
        for mix, clean in loader:
            est = model(mix)
            loss = loss_func(est, clean).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            running.append(loss.item())
            log.info(f"epoch {epoch} step {step:3d} neg_stoi {loss.item():.4f}")
        log.info(f"== epoch {epoch} mean neg_stoi {np.mean(running):.4f}")


if __name__ == "__main__":
    train(conf)
