"""Frame-level phone classifier with a 2-layer LSTM with projection (LSTMP) on long utterances.

Acoustic-model style setup: every utterance is a long sequence of noisy 20-dim feature frames
generated from per-phone templates, every frame carries the label of the phone it belongs to,
and the model is a stacked LSTMP (nn.LSTM with proj_size) followed by a linear classifier.
Trained with SGD + momentum on frame cross-entropy, gradient-norm clipping at --clip.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class UtteranceGenerator:
    def __init__(self, n_phones=8, feat_dim=20, seg_len=20, noise=0.5, seed=0):
        self.gen = torch.Generator().manual_seed(seed)
        self.templates = torch.linspace(-1, 1, n_phones * feat_dim).view(n_phones, feat_dim)
        self.n_phones, self.feat_dim, self.seg_len, self.noise = n_phones, feat_dim, seg_len, noise

    def batch(self, batch_size, n_frames):
        n_segments = n_frames // self.seg_len
        phones = torch.randint(0, self.n_phones, (batch_size, n_segments), generator=self.gen)
        labels = phones.repeat_interleave(self.seg_len, dim=1)
        feats = self.templates[labels] + self.noise * torch.randn(batch_size, n_frames, self.feat_dim, generator=self.gen)
        return feats, labels


class LSTMPAcousticModel(nn.Module):
    def __init__(self, feat_dim, hidden, proj, num_layers, n_phones):
        super().__init__()
        self.rnn = nn.LSTM(feat_dim, hidden, num_layers=num_layers, proj_size=proj, batch_first=True)
        self.classifier = nn.Linear(proj, n_phones)

    def forward(self, feats):
        out, _ = self.rnn(feats)
        return self.classifier(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--proj", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--clip", type=float, default=5.0)
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = UtteranceGenerator(seed=0)
    model = LSTMPAcousticModel(data.feat_dim, args.hidden, args.proj, args.layers, data.n_phones)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    start = time.time()
    total_loss, total_correct, total_frames = 0.0, 0, 0
    for it in range(1, args.iters + 1):
        feats, labels = data.batch(args.batch_size, args.frames)
        logits = model(feats)
        loss = F.cross_entropy(logits.reshape(-1, data.n_phones), labels.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()

        total_loss += loss.item()
        total_correct += (logits.argmax(-1) == labels).sum().item()
        total_frames += labels.numel()
        if it % args.log_interval == 0:
            print(f"iter {it:4d} | loss {total_loss / args.log_interval:.4f} | frame acc "
                  f"{total_correct / total_frames:.3f} | grad norm {grad_norm:.2f} | {time.time() - start:.1f}s")
            total_loss, total_correct, total_frames = 0.0, 0, 0


if __name__ == "__main__":
    main()
