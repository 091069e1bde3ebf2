"""Small CTC speech recogniser trained with PyTorch Lightning.

A toy "corpus" of utterances is synthesised in memory: every token of the
alphabet is a short harmonic tone, an utterance is a sequence of tokens with
random durations.  As in the fairseq speech_recognition example, the dataset
computes 40-band log filterbank features (25 ms window, 10 ms shift) and
applies per-utterance mean/variance normalisation in __getitem__.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
import lightning as L

SAMPLE_RATE = 16000
WIN = 400   # 25 ms
HOP = 160   # 10 ms
N_BANDS = 40
VOCAB = ["<blank>", "a", "e", "i", "o", "u", "k", "s", "t", "n", "m"]

HPARAMS = dict(num_utts=1600, batch_size=8, max_epochs=2, lr=1e-3, hidden=128, seed=7,
               log_every=10)


def token_tone(tok, n_samples, gen):
    f0 = 180.0 + 95.0 * tok
    t = torch.arange(n_samples) / SAMPLE_RATE
    wav = sum(torch.sin(2 * math.pi * f0 * h * t + torch.rand(1, generator=gen) * 6.28) / h
              for h in (1, 2, 3))
    return 0.3 * wav + 0.01 * torch.randn(n_samples, generator=gen)


def synth_corpus(num_utts, gen):
    corpus = []
    for i in range(num_utts):
        n_tok = int(torch.randint(2, 6, (1,), generator=gen))
        toks = torch.randint(1, len(VOCAB), (n_tok,), generator=gen).tolist()
        pieces = [token_tone(t, int(torch.randint(6, 14, (1,), generator=gen)) * HOP, gen)
                  for t in toks]
        corpus.append((torch.cat(pieces), toks))
    # a few clips in the crowd-sourced part of the corpus were cut right after
    # the first syllable onset
    for i in (303, 1043):
        tok = corpus[i][1][:1]
        corpus[i] = (token_tone(tok[0], 480, gen), tok)
    return corpus


def log_fbank(wav):
    frames = wav.unfold(0, WIN, HOP) * torch.hann_window(WIN)
    power = torch.fft.rfft(frames, dim=-1).abs() ** 2
    edges = torch.linspace(0, power.shape[-1], N_BANDS + 1).long()
    bands = torch.stack([power[:, a:b].sum(-1) for a, b in zip(edges[:-1], edges[1:])], dim=-1)
    return torch.log(bands + 1e-6)


def calc_mean_invstddev(feature, eps=1e-8):
    mean = feature.mean(0)
    var = feature.var(0)
    return mean, 1.0 / (torch.sqrt(var) + eps)


def apply_mv_norm(features):
    mean, invstddev = calc_mean_invstddev(features)
    return (features - mean) * invstddev


class ToneSpeechDataset(Dataset):
    def __init__(self, corpus):
        self.corpus = corpus

    def __len__(self):
        return len(self.corpus)

    def __getitem__(self, idx):
        wav, toks = self.corpus[idx]
        feats = apply_mv_norm(log_fbank(wav))
        return feats, torch.tensor(toks, dtype=torch.long)


def collate(batch):
    feats, targets = zip(*batch)
    feat_lens = torch.tensor([f.shape[0] for f in feats])
    tgt_lens = torch.tensor([t.numel() for t in targets])
    padded = nn.utils.rnn.pad_sequence(feats, batch_first=True)
    return padded, feat_lens, torch.cat(targets), tgt_lens


class ConvCTC(L.LightningModule):
    def __init__(self, hidden, lr, log_every):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(
            nn.Conv1d(N_BANDS, hidden, 5, padding=2), nn.GELU(),
            nn.Conv1d(hidden, hidden, 5, padding=2), nn.GELU(),
            nn.Conv1d(hidden, hidden, 5, padding=2), nn.GELU(),
        )
        self.proj = nn.Linear(hidden, len(VOCAB))

    def forward(self, feats):
        h = self.encoder(feats.transpose(1, 2)).transpose(1, 2)
        return self.proj(h).log_softmax(-1)

    def training_step(self, batch, batch_idx):
        feats, feat_lens, targets, tgt_lens = batch
        log_probs = self(feats).transpose(0, 1)
        loss = F.ctc_loss(log_probs, targets, feat_lens, tgt_lens, blank=0)
        step = self.global_step
        if step % self.hparams.log_every == 0:
            print(f"epoch {self.current_epoch} step {step:4d} ctc_loss {loss.item():.4f}")
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main():
    hp = HPARAMS
    L.seed_everything(hp["seed"], verbose=False)
    gen = torch.Generator().manual_seed(hp["seed"])
    corpus = synth_corpus(hp["num_utts"], gen)
    loader = DataLoader(ToneSpeechDataset(corpus), batch_size=hp["batch_size"], shuffle=True,
                        collate_fn=collate, generator=torch.Generator().manual_seed(hp["seed"]))
    model = ConvCTC(hp["hidden"], hp["lr"], hp["log_every"])
    trainer = L.Trainer(max_epochs=hp["max_epochs"], accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()
