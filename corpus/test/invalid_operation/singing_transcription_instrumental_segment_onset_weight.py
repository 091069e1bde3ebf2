"""Frame-level singing transcription (onset / silence / octave / pitch class) on split song segments.

A small conv net reads CQT-like frames of a vocal mix and predicts, per frame, an
onset/silence softmax plus octave and pitch-class classes, trained with the CE part of the
CTC_CE_for_AST recipe: batch size 1 per segment, gradients accumulated over several
segments, clip_grad_norm_(5.0), Adam.  The onset BCE is weighted per frame and normalised
by the total weight of the segment, torch.dot(bce, on_weight) / torch.sum(on_weight).  The
weights emphasise frames close to an annotated onset and are zero outside the sung phrases,
so accompaniment-only passages do not teach the onset head.

Songs are split into fixed 128-frame segments.  A few songs have a long instrumental
bridge, and a segment that falls entirely inside one has no onset and no vocal frame: its
on_weight is all zeros and the onset loss is 0 / 0 = NaN.  The first such segment makes the
loss nan, the NaN gradient goes through clip_grad_norm_ and Adam into every weight, and all
later losses are nan.

Reproduces: https://github.com/york135/CTC_CE_for_AST/issues/3 ("split_train_loss0 = nan
because torch.sum(on_weight) = 0": "there is no onset frame in this training sample").
Fixed by the author in commit 316b43d ("fix issue #3: divide by zero"): the denominators
become torch.clip(torch.sum(on_weight), min=1e-10) (and likewise for off_weight).
"""
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

HPARAMS = dict(n_songs=30, seg_len=128, n_bins=64, lr=1e-3, epochs=3, accum=4, seed=15,
               bridge_prob=0.12)
FRAME = 1024.0 / 44100.0          # seconds per frame
LOWEST_MIDI = 36                  # C2 .. B5, 4 octaves


def compose_song(rng, bridge_prob):
    """List of (onset_frame, offset_frame, midi) notes, in sung phrases."""
    notes, t = [], int(rng.integers(10, 40))
    n_phrases = int(rng.integers(5, 9))
    bridge_after = int(rng.integers(1, n_phrases - 1)) if rng.random() < bridge_prob else -1
    pitch = int(rng.integers(52, 68))
    for ph in range(n_phrases):
        for _ in range(int(rng.integers(6, 14))):
            dur = int(rng.integers(5, 22))
            pitch = int(np.clip(pitch + rng.integers(-4, 5), LOWEST_MIDI, 83))
            notes.append((t, t + dur, pitch))
            t += dur + int(rng.integers(0, 4))
        t += int(rng.integers(20, 45))                     # breath between phrases
        if ph == bridge_after:
            t += int(rng.integers(300, 420))               # instrumental bridge
    return notes, t + 30


def render_and_label(rng, notes, n_frames, n_bins):
    spec = rng.normal(0.0, 0.05, (n_frames, n_bins)).astype(np.float32)
    # accompaniment: a slowly changing chord under everything
    for start in range(0, n_frames, 86):
        root = int(rng.integers(0, 24))
        for b in (root, root + 4, root + 7):
            spec[start:start + 86, b] += 0.3
    onset = np.zeros(n_frames, np.float32)
    silence = np.ones(n_frames, np.float32)
    octave = np.full(n_frames, 4, np.int64)      # 4 = no pitch
    pclass = np.full(n_frames, 12, np.int64)     # 12 = no pitch
    on_weight = np.zeros(n_frames, np.float32)
    for on, off, midi in notes:
        b = midi - LOWEST_MIDI
        spec[on:off, b] += 1.0
        if b + 12 < n_bins:
            spec[on:off, b + 12] += 0.5
        spec[on, :] += 0.4                        # consonant burst at the onset
        onset[max(on - 1, 0):on + 2] = 1.0
        silence[on:off] = 0.0
        octave[on:off] = (midi - LOWEST_MIDI) // 12
        pclass[on:off] = midi % 12
    # onset weights: only inside sung phrases (notes closer than 0.5 s), peaked at the onsets
    starts = [n[0] for n in notes]
    phrase_lo, phrase_hi = notes[0][0], notes[0][1]
    for on, off, _ in notes[1:] + [(10 ** 9, 10 ** 9, 0)]:
        if (on - phrase_hi) * FRAME > 0.5:
            on_weight[max(phrase_lo - 9, 0):phrase_hi + 9] = 1.0
            phrase_lo = on
        phrase_hi = max(phrase_hi, off)
    for s in starts:
        for i in range(max(s - 3, 0), min(s + 4, n_frames)):
            dist = abs(i - s) * FRAME
            on_weight[i] = max(on_weight[i], min(max(1.0 - dist * 20.0, 0.0), 1.0) * 20.0)
    return spec, np.stack([onset, silence], 1), octave, pclass, on_weight


class SplitSegmentDataset(Dataset):
    def __init__(self, rng, n_songs, seg_len, n_bins, bridge_prob):
        self.items = []
        for _ in range(n_songs):
            notes, n_frames = compose_song(rng, bridge_prob)
            spec, onoff, octave, pclass, on_w = render_and_label(rng, notes, n_frames, n_bins)
            for s in range(0, n_frames - seg_len + 1, seg_len):
                sl = slice(s, s + seg_len)
                weights = np.stack([on_w[sl], np.ones(seg_len, np.float32)])   # on, off
                self.items.append((spec[sl], weights, onoff[sl], octave[sl], pclass[sl]))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        spec, weights, onoff, octave, pclass = self.items[idx]
        return (torch.from_numpy(spec), torch.from_numpy(weights), torch.from_numpy(onoff),
                torch.from_numpy(octave), torch.from_numpy(pclass))


class OnsetPitchNet(nn.Module):
    def __init__(self, n_bins, ch=96):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv1d(n_bins, ch, 5, padding=2), nn.BatchNorm1d(ch), nn.ReLU(),
            nn.Conv1d(ch, ch, 5, padding=4, dilation=2), nn.BatchNorm1d(ch), nn.ReLU(),
            nn.Conv1d(ch, ch, 3, padding=1), nn.ReLU(),
        )
        self.on_off = nn.Conv1d(ch, 3, 1)      # 0: sustain, 1: onset, 2: silence/offset
        self.octave = nn.Conv1d(ch, 5, 1)
        self.pitch_class = nn.Conv1d(ch, 13, 1)

    def forward(self, x):                      # x: (B, T, n_bins)
        h = self.body(x.transpose(1, 2))
        on_off_sm = self.on_off(h).transpose(1, 2).softmax(-1)
        return on_off_sm, self.octave(h).transpose(1, 2), self.pitch_class(h).transpose(1, 2)


class CELoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.onset_criterion = nn.BCELoss(reduction="none")
        self.offset_criterion = nn.BCELoss(reduction="none")
        self.octave_criterion = nn.CrossEntropyLoss(ignore_index=100)
        self.pitch_criterion = nn.CrossEntropyLoss(ignore_index=100)

    def forward(self, batch, model_output, split_sum):
        _, weights, onoff, octave, pclass = batch
        on_off_sm, octave_logits, pclass_logits = model_output
        onset_p = torch.clip(on_off_sm[:, :, 1], min=1e-7, max=1 - 1e-7)
        offset_p = torch.clip(on_off_sm[:, :, 2], min=1e-7, max=1 - 1e-7)
        on_weight, off_weight = weights[0][0:1], weights[0][1:2]
        loss0 = torch.dot(self.onset_criterion(onset_p, onoff[:, :, 0])[0], on_weight[0]) / torch.sum(on_weight)
        loss1 = torch.dot(self.offset_criterion(offset_p, onoff[:, :, 1])[0], off_weight[0]) / torch.sum(off_weight)
        loss2 = self.octave_criterion(octave_logits.permute(0, 2, 1), octave)
        loss3 = self.pitch_criterion(pclass_logits.permute(0, 2, 1), pclass)
        for k, v in enumerate((loss0, loss1, loss2, loss3)):
            split_sum[k] += v.item()
        return loss0 + loss1 + loss2 + loss3


class Transcriber:
    def __init__(self, hp):
        self.hp = hp
        self.model = OnsetPitchNet(hp["n_bins"])
        self.loss_fn = CELoss()

    def fit(self, dataset):
        hp = self.hp
        loader = DataLoader(dataset, batch_size=1, shuffle=True, drop_last=True)
        optimizer = torch.optim.Adam(self.model.parameters(), lr=hp["lr"], betas=(0.9, 0.999))
        optimizer.zero_grad()
        step, window, split = 0, 0.0, np.zeros(4)
        for epoch in range(1, hp["epochs"] + 1):
            self.model.train()
            for batch_idx, batch in enumerate(loader):
                loss = self.loss_fn(batch, self.model(batch[0]), split)
                window += loss.item()
                (loss / hp["accum"]).backward()
                nn.utils.clip_grad_norm_(self.model.parameters(), 5.0)
                if (batch_idx + 1) % hp["accum"] == 0:
                    optimizer.step()
                    optimizer.zero_grad()
                    step += 1
                    n = hp["accum"]
                    print(f"epoch {epoch} step {step:4d}  loss {window / n:.4f}  "
                          f"onset {split[0] / n:.4f} offset {split[1] / n:.4f} "
                          f"octave {split[2] / n:.4f} pitch {split[3] / n:.4f}")
                    window, split = 0.0, np.zeros(4)


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.manual_seed(HPARAMS["seed"])
    rng = np.random.default_rng(HPARAMS["seed"])
    data = SplitSegmentDataset(rng, HPARAMS["n_songs"], HPARAMS["seg_len"], HPARAMS["n_bins"],
                               HPARAMS["bridge_prob"])
    silent = sum(1 for it in data.items if it[1][0].sum() == 0)
    print(f"{len(data)} segments, {silent} without any onset weight")
    Transcriber(HPARAMS).fit(data)
