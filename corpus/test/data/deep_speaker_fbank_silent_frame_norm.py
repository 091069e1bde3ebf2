"""Deep Speaker softmax pre-training on filter banks with per-frame normalisation.

Setting: philipperemy/deep-speaker turns every utterance into filter-bank features once, before
training (``Audio.build_cache`` -> ``read_mfcc`` -> ``mfcc_fbank`` -> ``normalize_frames``),
then cuts fixed-length crops per speaker into ``kx_train`` / ``ky_train`` (the
``KerasFormatConverter``) and pre-trains the ResCNN speaker model with a softmax head
(clipped ReLU, BatchNorm, residual blocks, temporal average, affine 512, softmax).  Here the
cache and the crops are built in the ``Audio`` Dataset's ``__init__``.

Bug: ``normalize_frames`` standardises each frame across its filter banks,
``(v - mean(v)) / std(v)``.  ``fbank`` (python_speech_features) replaces zero energies by
machine epsilon, so a frame of digital silence (a dropout in the recording, here 0.35 s of exact
zeros inside one utterance) has the same value in every bank: ``std(v) == 0`` and the frame
becomes 0/0 = NaN.  Only the crops that overlap that stretch carry NaN, so the first training
batches are fine; the first batch that contains such a crop makes BatchNorm, the softmax loss
and all gradients NaN, Adam writes NaN into every weight and the loss stays NaN.

Report: https://github.com/philipperemy/deep-speaker/issues/5 ("frame normalisation gives nan
in case of long silence", since std(v) is zero), closed as fixed.
Fix (the change merged into the repository, still in deep_speaker/audio.py): floor the
standard deviation, ``(v - np.mean(v)) / max(np.std(v), epsilon)`` with ``epsilon=1e-12``.
"""
import functools
import logging
import os
import tempfile
from collections import defaultdict
from random import choice, seed as py_seed

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(message)s')
logger = logging.getLogger(__name__)

SAMPLE_RATE = 8000
NUM_FBANKS = 32
NUM_FRAMES = 48
BATCH_SIZE = 16
NUM_PER_SPEAKER = 24


# --- python_speech_features.fbank, reduced to what deep-speaker uses -------------------------
def _hz2mel(hz):
    return 2595 * np.log10(1 + hz / 700.)


def _mel2hz(mel):
    return 700 * (10 ** (mel / 2595.0) - 1)


@functools.lru_cache(maxsize=None)
def get_filterbanks(nfilt, nfft, samplerate):
    melpoints = np.linspace(_hz2mel(0), _hz2mel(samplerate / 2), nfilt + 2)
    bin_ = np.floor((nfft + 1) * _mel2hz(melpoints) / samplerate)
    fbank_ = np.zeros([nfilt, nfft // 2 + 1])
    for j in range(nfilt):
        for i in range(int(bin_[j]), int(bin_[j + 1])):
            fbank_[j, i] = (i - bin_[j]) / (bin_[j + 1] - bin_[j])
        for i in range(int(bin_[j + 1]), int(bin_[j + 2])):
            fbank_[j, i] = (bin_[j + 2] - i) / (bin_[j + 2] - bin_[j + 1])
    return fbank_


def fbank(signal, samplerate, winlen=0.025, winstep=0.01, nfilt=26, nfft=512, preemph=0.97):
    signal = np.append(signal[0], signal[1:] - preemph * signal[:-1])
    frame_len, frame_step = int(round(winlen * samplerate)), int(round(winstep * samplerate))
    numframes = 1 + int(np.ceil((1.0 * len(signal) - frame_len) / frame_step))
    padsignal = np.concatenate((signal, np.zeros((numframes - 1) * frame_step + frame_len - len(signal))))
    indices = np.arange(frame_len)[None, :] + np.arange(numframes)[:, None] * frame_step
    frames = padsignal[indices]
    pspec = 1.0 / nfft * np.square(np.abs(np.fft.rfft(frames, nfft)))
    energy = np.sum(pspec, 1)
    energy = np.where(energy == 0, np.finfo(float).eps, energy)  # if energy is zero, we get problems with log
    feat = np.dot(pspec, get_filterbanks(nfilt, nfft, samplerate).T)
    feat = np.where(feat == 0, np.finfo(float).eps, feat)  # if feat is zero, we get problems with log
    return feat, energy


# --- deep_speaker/audio.py ---------------------------------------------------------------------
def normalize_frames(m):
    return [(v - np.mean(v)) / np.std(v) for v in m]


def mfcc_fbank(signal, sample_rate):  # 1D signal array.
    # Returns MFCC with shape (num_frames, n_filters).
    filter_banks, energies = fbank(signal, samplerate=sample_rate, nfilt=NUM_FBANKS)
    frames_features = normalize_frames(filter_banks)
    return np.array(frames_features, dtype=np.float32)  # Float32 precision is enough here.


def read_mfcc(audio, sample_rate):
    energy = np.abs(audio)
    silence_threshold = np.percentile(energy, 95)
    offsets = np.where(energy > silence_threshold)[0]
    audio_voice_only = audio[offsets[0]:offsets[-1]]
    return mfcc_fbank(audio_voice_only, sample_rate)


def pad_mfcc(mfcc, max_length):  # num_frames, nfilt.
    if len(mfcc) < max_length:
        mfcc = np.vstack((mfcc, np.tile(np.zeros(mfcc.shape[1]), (max_length - len(mfcc), 1))))
    return mfcc


def sample_from_mfcc(mfcc, max_length):
    if mfcc.shape[0] >= max_length:
        r = choice(range(0, len(mfcc) - max_length + 1))
        s = mfcc[r:r + max_length]
    else:
        s = pad_mfcc(mfcc, max_length)
    return np.expand_dims(s, axis=0)  # channels first


def synthetic_librispeech(num_speakers=12, utterances_per_speaker=8, seconds=1.2, rng_seed=11):
    """Stand-in for LibriSpeech flac files: voiced harmonics with a speaker-specific pitch and
    formants, syllable-like envelopes.  Utterance 6 of speaker 4 has a 0.35 s recording dropout
    (exact digital zeros) in the middle."""
    rng = np.random.RandomState(rng_seed)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    out = []
    for sp in range(num_speakers):
        f0 = 90 + 14 * sp
        formants = rng.uniform(300, 3200, size=3)
        for utt in range(utterances_per_speaker):
            wav = np.zeros_like(t)
            for h in range(1, 25):
                fh = f0 * h * (1 + 0.01 * rng.randn())
                if fh > SAMPLE_RATE / 2 - 200:
                    break
                gain = sum(np.exp(-((fh - f) / 250.0) ** 2) for f in formants) + 0.05
                wav += gain * np.sin(2 * np.pi * fh * t + rng.uniform(0, 2 * np.pi))
            envelope = 0.6 + 0.4 * np.sin(2 * np.pi * rng.uniform(2, 5) * t + rng.uniform(0, 6)) ** 2
            wav = 0.1 * wav * envelope + 0.003 * rng.randn(len(t))
            if sp == 4 and utt == 6:
                start = int(0.45 * SAMPLE_RATE)
                wav[start:start + int(0.35 * SAMPLE_RATE)] = 0.0
            out.append(('%d' % (19 + sp), '%04d' % utt, wav.astype(np.float32)))
    return out


class Audio(Dataset):
    """Builds the fbank cache (one .npy per utterance) and the training crops up-front."""

    def __init__(self, cache_dir, utterances, sample_rate=SAMPLE_RATE, max_length=NUM_FRAMES,
                 num_per_speaker=NUM_PER_SPEAKER):
        self.cache_dir = os.path.join(cache_dir, 'audio-fbanks')
        os.makedirs(self.cache_dir, exist_ok=True)
        self.build_cache(utterances, sample_rate)
        self.speakers_to_utterances = defaultdict(dict)
        for cache_file in sorted(os.listdir(self.cache_dir)):
            speaker_id, utterance_id = os.path.splitext(cache_file)[0].split('_')
            self.speakers_to_utterances[speaker_id][utterance_id] = os.path.join(self.cache_dir, cache_file)
        self.speaker_ids = sorted(self.speakers_to_utterances)
        self.map = dict(zip(self.speaker_ids, range(len(self.speaker_ids))))
        self.kx, self.ky = self.generate_per_phase(max_length, num_per_speaker)
        logger.info(f'kx_train.shape = {self.kx.shape}')
        logger.info(f'ky_train.shape = {self.ky.shape}')

    def build_cache(self, utterances, sample_rate):
        logger.info(f'Found {len(utterances):,} utterances.')
        for sp, utt, audio in utterances:
            cache_filename = os.path.join(self.cache_dir, f'{sp}_{utt}.npy')
            if not os.path.isfile(cache_filename):
                mfcc = read_mfcc(audio, sample_rate)
                np.save(cache_filename, mfcc)

    def generate_per_phase(self, max_length, num_per_speaker):
        num_speakers = len(self.speaker_ids)
        kx = np.zeros((num_speakers * num_per_speaker, 1, max_length, NUM_FBANKS), dtype=np.float32)
        ky = np.zeros((num_speakers * num_per_speaker,), dtype=np.int64)
        for i, speaker_id in enumerate(self.speaker_ids):
            utterances_files = sorted(self.speakers_to_utterances[speaker_id].values())
            for j, utterance_file in enumerate(np.random.choice(utterances_files, size=num_per_speaker,
                                                                replace=True)):
                kx[i * num_per_speaker + j] = sample_from_mfcc(np.load(utterance_file), max_length)
                ky[i * num_per_speaker + j] = self.map[speaker_id]
        return kx, ky

    def __len__(self):
        return len(self.ky)

    def __getitem__(self, index):
        return torch.from_numpy(self.kx[index]), int(self.ky[index])


# --- deep_speaker/conv_models.py (ResCNN) -------------------------------------------------------
def clipped_relu(x):
    return torch.clamp(x, 0, 20)


class IdentityBlock(nn.Module):
    def __init__(self, filters, kernel_size=3):
        super().__init__()
        self.conv_a = nn.Conv2d(filters, filters, kernel_size, padding=1)
        self.bn_a = nn.BatchNorm2d(filters)
        self.conv_b = nn.Conv2d(filters, filters, kernel_size, padding=1)
        self.bn_b = nn.BatchNorm2d(filters)

    def forward(self, x):
        y = clipped_relu(self.bn_a(self.conv_a(x)))
        y = self.bn_b(self.conv_b(y))
        return clipped_relu(y + x)


class ConvResBlock(nn.Module):
    def __init__(self, in_filters, filters):
        super().__init__()
        self.conv = nn.Conv2d(in_filters, filters, 5, stride=2, padding=2)
        self.bn = nn.BatchNorm2d(filters)
        self.res = IdentityBlock(filters)

    def forward(self, x):
        return self.res(clipped_relu(self.bn(self.conv(x))))


class DeepSpeakerModel(nn.Module):
    def __init__(self, num_speakers_softmax, include_softmax=True):
        super().__init__()
        self.blocks = nn.Sequential(ConvResBlock(1, 8), ConvResBlock(8, 16), ConvResBlock(16, 32))
        self.affine = nn.Linear(32 * (NUM_FBANKS // 8), 512)
        self.include_softmax = include_softmax
        self.dropout = nn.Dropout(0.5)
        self.softmax_head = nn.Linear(512, num_speakers_softmax)

    def forward(self, x):
        x = self.blocks(x)                                 # (B, C, T/8, F/8)
        x = x.permute(0, 2, 1, 3).flatten(2)               # reshape to (B, T/8, C * F/8)
        x = x.mean(dim=1)                                  # temporal average
        x = self.affine(x)
        if self.include_softmax:
            return self.softmax_head(self.dropout(x))
        return F.normalize(x, dim=1)                       # ln: L2 normalisation


def fit_model_softmax(dsm, train_set, epochs=2, lr=0.001):
    loader = DataLoader(train_set, batch_size=BATCH_SIZE, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.Adam(dsm.parameters(), lr=lr)
    step = 0
    for epoch in range(epochs):
        dsm.train()
        seen, loss_sum, correct = 0, 0.0, 0
        for x, y in loader:
            logits = dsm(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            seen += len(y)
            loss_sum += loss.item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
            print(f'step {step} - loss: {loss.item():.4f}')
        logger.info(f'Epoch {epoch + 1}/{epochs} - loss: {loss_sum / seen:.4f} - accuracy: {correct / seen:.4f}')


def main():
    np.random.seed(123)
    py_seed(123)
    torch.manual_seed(123)
    torch.set_num_threads(2)
    working_dir = tempfile.mkdtemp(prefix='deep-speaker-')
    train_set = Audio(working_dir, synthetic_librispeech())
    dsm = DeepSpeakerModel(num_speakers_softmax=len(train_set.speaker_ids))
    fit_model_softmax(dsm, train_set)


if __name__ == '__main__':
    main()
