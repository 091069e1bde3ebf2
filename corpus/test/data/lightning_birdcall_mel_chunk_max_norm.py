"""Bird-call classifier (PyHa / acoustic-multiclass-training style) ported to Lightning: an
annotation table (IN FILE, OFFSET, DURATION, SCIENTIFIC) made by sliding 2-second chunks over
the labelled calls of each recording; the Dataset loads each chunk with a frame offset, pads
it to 2 s, computes a mel spectrogram, stacks it into a 3-channel "image" and normalises the
image by its maximum; a small CNN with GeM pooling is trained with soft-target cross-entropy.

Reproduces the bug fixed in UCSD-E4E/acoustic-multiclass-training PR #9 (commit fe8f6d3
"Added code to handle nan / prevent nan inputs": "loss value would become nan ... caused by
'danger' normalizing code that assumed the max value in the mel would not be zero").  One
recording upload was cut short (11.5 s stored, labels made on the full recording), so its
last chunk starts after the end of the file: the loader returns zero frames, padding turns
them into 2 s of digital silence, the mel spectrogram is all zeros and
`image / torch.abs(image).max()` is 0/0 = NaN.  The first batch holding that chunk (when the
noise augmentation does not hit it) gives a nan loss, BatchNorm and Adam spread the NaN to
every weight and the loss stays nan from then on.  Fix (PR #9): add a small constant to the
maximum, `max_val = torch.abs(image).max() + 0.000001` (the PR also drops annotations whose
spectrogram contains NaN).
"""
import argparse
import csv
import io

import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

SPECIES = ["Turdus migratorius", "Cardinalis cardinalis", "Zenaida macroura",
           "Poecile atricapillus", "Melospiza melodia", "Sialia sialis"]


def create_parser():
    parser = argparse.ArgumentParser()
    parser.add_argument("-e", "--epochs", default=2, type=int)
    parser.add_argument("-tbs", "--train_batch_size", default=8, type=int)
    parser.add_argument("-sr", "--sample_rate", default=8_000, type=int)
    parser.add_argument("-mt", "--max_time", default=2, type=int)
    parser.add_argument("-nm", "--n_mels", default=32, type=int)
    parser.add_argument("-nfft", "--n_fft", default=256, type=int)
    parser.add_argument("-hl", "--hop_length", default=128, type=int)
    parser.add_argument("-s", "--seed", default=0, type=int)
    parser.add_argument("-lr", "--lr", type=float, default=1e-3)
    parser.add_argument("-lf", "--logging_freq", default=5, type=int)
    parser.add_argument("-np", "--noise_p", type=float, default=0.35)
    parser.add_argument("-nsd", "--noise_std", type=float, default=0.005)
    parser.add_argument("-fmp", "--freq_mask_p", type=float, default=0.5)
    parser.add_argument("-fmpa", "--freq_mask_param", type=int, default=6)
    parser.add_argument("-tmp", "--time_mask_p", type=float, default=0.5)
    parser.add_argument("-tmpa", "--time_mask_param", type=int, default=20)
    parser.add_argument("-sm", "--smoothing", type=float, default=0.05)
    parser.add_argument("-st", "--offset_col", default="OFFSET", type=str)
    parser.add_argument("-et", "--duration_col", default="DURATION", type=str)
    parser.add_argument("-fp", "--file_path_col", default="IN FILE", type=str)
    parser.add_argument("-mi", "--manual_id_col", default="SCIENTIFIC", type=str)
    return parser


# --------------------------------------------------------------- synthetic field recordings
def build_corpus(sample_rate, seed):
    """Returns {file name: waveform} and the annotation CSV text."""
    rng = np.random.default_rng(seed)
    recordings, rows = {}, []
    for i in range(24):
        species = i % len(SPECIES)
        name = f"XC{51000 + 37 * i}.wav"
        duration = float(rng.uniform(8.0, 12.0))
        t = np.arange(int(duration * sample_rate)) / sample_rate
        audio = 0.01 * rng.normal(size=t.size)
        f0 = 700.0 + 450.0 * species
        call_times = np.sort(rng.uniform(0.2, duration - 0.6, size=int(rng.integers(6, 12))))
        for c in call_times:
            seg = (t >= c) & (t < c + 0.35)
            tt = t[seg] - c
            sweep = f0 * (1.0 + 0.4 * tt / 0.35 * (1 if species % 2 else -1))
            audio[seg] += 0.3 * np.sin(2 * np.pi * np.cumsum(sweep) / sample_rate) * np.hanning(seg.sum())
        labelled_end = duration
        if i == 17:
            # upload cut short: labels were made on the full 14 s recording
            labelled_end, audio = 14.0, audio[: int(11.5 * sample_rate)]
        recordings[name] = audio.astype(np.float32)
        for offset in np.arange(0.0, labelled_end - 1.5, 1.0):
            rows.append({"IN FILE": name, "OFFSET": f"{offset:.1f}", "DURATION": "2.0",
                         "SCIENTIFIC": SPECIES[species]})
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["IN FILE", "OFFSET", "DURATION", "SCIENTIFIC"])
    writer.writeheader()
    writer.writerows(rows)
    return recordings, buf.getvalue()


def load_audio(recordings, path, frame_offset, num_frames):
    """Like torchaudio.load(path, frame_offset=..., num_frames=...): (1, frames) tensor."""
    audio = recordings[path][frame_offset:frame_offset + num_frames]
    return torch.from_numpy(audio.copy()).unsqueeze(0)


def mel_filterbank(n_freqs, n_mels, sample_rate):
    hz_to_mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)
    mel_to_hz = lambda m: 700.0 * (10 ** (m / 2595.0) - 1.0)
    all_freqs = np.linspace(0, sample_rate // 2, n_freqs)
    m_pts = np.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2), n_mels + 2)
    f_pts = mel_to_hz(m_pts)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts[None, :] - all_freqs[:, None]
    down = -slopes[:, :-2] / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    return torch.tensor(np.maximum(0.0, np.minimum(down, up)), dtype=torch.float32)


class MelSpectrogram(nn.Module):
    def __init__(self, sample_rate, n_fft, hop_length, n_mels):
        super().__init__()
        self.n_fft, self.hop_length = n_fft, hop_length
        self.register_buffer("window", torch.hann_window(n_fft))
        self.register_buffer("fb", mel_filterbank(n_fft // 2 + 1, n_mels, sample_rate))

    def forward(self, audio):
        spec = torch.stft(audio, self.n_fft, self.hop_length, window=self.window,
                          return_complex=True).abs() ** 2
        return (spec.transpose(-1, -2) @ self.fb).transpose(-1, -2)


# --------------------------------------------------------------------------------- dataset
class PyhaDF_Dataset(Dataset):
    def __init__(self, csv_text, recordings, config, train=True):
        self.samples = list(csv.DictReader(io.StringIO(csv_text)))
        self.recordings = recordings
        self.config = config
        self.train = train
        self.target_sample_rate = config.sample_rate
        self.num_samples = config.sample_rate * config.max_time
        self.mel_spectogram = MelSpectrogram(config.sample_rate, config.n_fft, config.hop_length, config.n_mels)
        self.classes = sorted({row[config.manual_id_col] for row in self.samples})
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.num_classes = len(self.classes)
        print(len(self.samples), "files in use")

    def __len__(self):
        return len(self.samples)

    def freq_mask(self, image):
        width = int(torch.randint(0, self.config.freq_mask_param + 1, (1,)))
        start = int(torch.randint(0, image.shape[-2] - width + 1, (1,)))
        image = image.clone()
        image[..., start:start + width, :] = 0.0
        return image

    def time_mask(self, image):
        width = int(torch.randint(0, self.config.time_mask_param + 1, (1,)))
        start = int(torch.randint(0, image.shape[-1] - width + 1, (1,)))
        image = image.clone()
        image[..., start:start + width] = 0.0
        return image

    def __getitem__(self, index):
        annotation = self.samples[index]
        path = annotation[self.config.file_path_col]
        sample_per_sec = self.target_sample_rate
        frame_offset = int(float(annotation[self.config.offset_col]) * sample_per_sec)
        num_frames = int(float(annotation[self.config.duration_col]) * sample_per_sec)

        target = torch.zeros(self.num_classes)
        target[self.class_to_idx[annotation[self.config.manual_id_col]]] = 1.0
        target = target * (1 - self.config.smoothing) + self.config.smoothing / self.num_classes

        audio = load_audio(self.recordings, path, frame_offset, num_frames)
        audio = torch.mean(audio, dim=0)
        # Crop if too long, pad if too short
        if audio.shape[0] > self.num_samples:
            audio = audio[: self.num_samples]
        if audio.shape[0] < self.num_samples:
            audio = F.pad(audio, (0, self.num_samples - audio.shape[0]))
        # Add noise
        if self.train and torch.rand(1) < self.config.noise_p:
            audio = audio + torch.randn_like(audio) * self.config.noise_std

        mel = self.mel_spectogram(audio)
        image = torch.stack([mel, mel, mel])

        # Normalize Image
        max_val = torch.abs(image).max()
        image = image / max_val

        # Frequency masking and time masking
        if self.train and torch.rand(1) < self.config.freq_mask_p:
            image = self.freq_mask(image)
        if self.train and torch.rand(1) < self.config.time_mask_p:
            image = self.time_mask(image)
        return image, target


class BirdCallDataModule(L.LightningDataModule):
    def __init__(self, config):
        super().__init__()
        self.config = config

    def setup(self, stage=None):
        if hasattr(self, "train_dataset"):
            return
        recordings, csv_text = build_corpus(self.config.sample_rate, self.config.seed)
        self.train_dataset = PyhaDF_Dataset(csv_text, recordings, self.config, train=True)

    def train_dataloader(self):
        return DataLoader(self.train_dataset, batch_size=self.config.train_batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(self.config.seed))


# ----------------------------------------------------------------------------------- model
class GeM(nn.Module):
    def __init__(self, p=3, eps=1e-6):
        super().__init__()
        self.p = nn.Parameter(torch.ones(1) * p)
        self.eps = eps

    def forward(self, x):
        return F.avg_pool2d(x.clamp(min=self.eps).pow(self.p), (x.size(-2), x.size(-1))).pow(1.0 / self.p)


class BirdCLEFModel(L.LightningModule):
    def __init__(self, num_classes, config, embedding_size=64):
        super().__init__()
        self.config = config

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                 nn.SiLU(), nn.MaxPool2d(2))

        self.backbone = nn.Sequential(block(3, 16), block(16, 32), block(32, 48))
        self.pooling = GeM()
        self.embedding = nn.Linear(48, embedding_size)
        self.fc = nn.Linear(embedding_size, num_classes)
        self.loss_fn = nn.CrossEntropyLoss()
        self.seen_nonfinite = False

    def forward(self, images):
        features = self.backbone(images)
        return self.fc(self.embedding(self.pooling(features).flatten(1)))

    def training_step(self, batch, batch_idx):
        mels, labels = batch
        outputs = self(mels)
        loss = self.loss_fn(outputs, labels)
        acc = (outputs.argmax(1) == labels.argmax(1)).float().mean()
        first_nonfinite = not torch.isfinite(loss) and not self.seen_nonfinite
        self.seen_nonfinite |= bool(first_nonfinite)
        if self.global_step % self.config.logging_freq == 0 or first_nonfinite:
            print(f"epoch {self.current_epoch} step {self.global_step:3d}  Loss: {loss.item():.4f}  "
                  f"Accuracy: {100 * acc.item():.1f}")
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.config.lr)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, eta_min=1e-5, T_max=100)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main():
    config = create_parser().parse_args()
    torch.set_num_threads(1)  # small CNN: one intra-op thread is faster on CPU
    L.seed_everything(config.seed, verbose=False)
    datamodule = BirdCallDataModule(config)
    datamodule.setup()
    model = BirdCLEFModel(datamodule.train_dataset.num_classes, config)
    trainer = L.Trainer(max_epochs=config.epochs, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, datamodule=datamodule)


if __name__ == "__main__":
    main()
