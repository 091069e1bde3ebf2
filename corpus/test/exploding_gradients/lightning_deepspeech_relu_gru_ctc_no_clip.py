"""DeepSpeech-style speech recogniser (Conv1D + ReLU GRUs + CTC) ported to Lightning.

A port of the Baidu "ba-dls-deepspeech" Keras/Theano recipe to a LightningModule:
a strided 1-D convolution over the spectrogram frames, three GRU layers whose
candidate activation is ReLU (Keras GRU(activation='relu')), batch norm after
every layer, a time-distributed linear layer and the CTC cost averaged over the
utterances of a batch, optimised with Nesterov momentum 0.99.  Utterances are
sorted by duration (short ones first), as the recipe's data generator does for
the first epoch.  The corpus is a synthetic "spoken spelling" set: each
character has a spectral signature held for a few frames, with silence around
the utterance and noise on top.

Reported in https://github.com/baidu-research/ba-dls-deepspeech/issues/20
("Getting Loss as NaN" after ~110 iterations of epoch 1; see also issue #7,
"Loss becomes nan after a while", where the loss went nan after thousands of
iterations once the training function had been rewritten).  The recipe's own
compile_train_fn bounds the update with
lasagne.updates.total_norm_constraint(grads, 100) before the Nesterov step, and
the answer in #20 trains with "base_lr: 1e-4, clipnorm: 200"; this port lost the
clipping when the training function became a LightningModule + Trainer.  The ReLU recurrence is
unbounded, so once the recurrent weights have grown a batch of long utterances
produces a gradient thousands of times the usual norm; the unclipped momentum
step throws the weights out and the CTC cost turns nan.

Fix: clip the gradient norm again, e.g. pl.Trainer(..., gradient_clip_val=10).
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import lightning.pytorch as pl

CHAR_MAP = "_ abcdefghijklmnopqrstuvwxyz'"      # index 0 is the CTC blank
WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "big", "red",
         "house", "we", "see", "it", "go", "up", "down", "sun", "is", "hot", "and",
         "blue", "sky", "fish", "swim", "in", "sea", "bird", "fly", "high", "o'clock"]

CONFIG = {
    "n_utterances": 320,
    "max_words": 8,
    "feat_dim": 40,
    "nodes": 64,
    "recur_layers": 3,
    "conv_context": 11,
    "conv_stride": 2,
    "batch_size": 16,
    "learning_rate": 1e-2,
    "momentum": 0.99,
    "epochs": 6,
    "seed": 0,
}


def text_to_int(text):
    return [CHAR_MAP.index(c) for c in text]


def conv_output_length(input_length, filter_size, stride):
    return (input_length - filter_size + stride) // stride


class SpokenSpellingCorpus(Dataset):
    """Log-power features of synthetic utterances, normalised and sorted by duration."""

    def __init__(self, n_utts, feat_dim, max_words, seed=0):
        rng = np.random.RandomState(seed)
        signatures = rng.gamma(2.0, 1.0, size=(len(CHAR_MAP), feat_dim)).astype(np.float32)
        self.items = []
        for _ in range(n_utts):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max_words)))
            frames = [np.zeros((rng.randint(4, 9), feat_dim), np.float32)]      # leading silence
            for ch in text:
                dur = rng.randint(3, 7)
                frames.append(signatures[CHAR_MAP.index(ch)][None, :] * rng.uniform(0.7, 1.3, size=(dur, 1)))
            frames.append(np.zeros((rng.randint(4, 9), feat_dim), np.float32))  # trailing silence
            power = np.concatenate(frames, axis=0)
            power = power + rng.exponential(0.3, size=power.shape)
            self.items.append((np.log(power + 1e-3).astype(np.float32), text))
        all_feats = np.concatenate([f for f, _ in self.items], axis=0)
        self.feats_mean = all_feats.mean(axis=0)
        self.feats_std = all_feats.std(axis=0)
        self.items.sort(key=lambda item: item[0].shape[0])

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        feats, text = self.items[i]
        feats = (feats - self.feats_mean) / (self.feats_std + 1e-14)
        return torch.from_numpy(feats), torch.tensor(text_to_int(text))


def pad_batch(batch):
    feats, labels = zip(*batch)
    lens = torch.tensor([f.shape[0] for f in feats])
    x = torch.zeros(len(feats), int(lens.max()), feats[0].shape[1])
    for i, f in enumerate(feats):
        x[i, :f.shape[0]] = f
    return x, lens, torch.cat(labels), torch.tensor([len(l) for l in labels])


class ReluGRU(nn.Module):
    """GRU layer with a ReLU candidate activation, returning the whole sequence."""

    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.kernel = nn.Linear(input_size, 3 * hidden_size)
        self.recurrent = nn.Linear(hidden_size, 3 * hidden_size, bias=False)
        nn.init.xavier_uniform_(self.kernel.weight)
        nn.init.orthogonal_(self.recurrent.weight)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.hidden_size)
        gates_x = self.kernel(x)
        outputs = []
        for t in range(x.shape[1]):
            xz, xr, xh = gates_x[:, t].chunk(3, dim=1)
            hz, hr, hh = self.recurrent(h).chunk(3, dim=1)
            z = torch.sigmoid(xz + hz)
            r = torch.sigmoid(xr + hr)
            h = z * h + (1 - z) * torch.relu(xh + r * hh)
            outputs.append(h)
        return torch.stack(outputs, dim=1)


class SpeechGRU(pl.LightningModule):
    def __init__(self, input_dim, nodes, recur_layers, conv_context, conv_stride,
                 learning_rate, momentum):
        super().__init__()
        self.save_hyperparameters()
        self.conv_1d = nn.Conv1d(input_dim, nodes, conv_context, stride=conv_stride)
        self.bn_conv_1d = nn.BatchNorm1d(nodes)
        self.rnns = nn.ModuleList([ReluGRU(nodes, nodes) for _ in range(recur_layers)])
        self.bn_rnns = nn.ModuleList([nn.BatchNorm1d(nodes) for _ in range(recur_layers)])
        self.dense = nn.Linear(nodes, len(CHAR_MAP))

    def forward(self, x):
        out = self.bn_conv_1d(torch.relu(self.conv_1d(x.transpose(1, 2)))).transpose(1, 2)
        for rnn, bn in zip(self.rnns, self.bn_rnns):
            out = bn(rnn(out).transpose(1, 2)).transpose(1, 2)
        return self.dense(out)          # no softmax here, CTC does that

    def training_step(self, batch, batch_idx):
        x, lens, labels, label_lens = batch
        output_lens = conv_output_length(lens, self.hparams.conv_context, self.hparams.conv_stride)
        log_probs = F.log_softmax(self(x), dim=-1).transpose(0, 1)
        ctc_cost = F.ctc_loss(log_probs, labels, output_lens, label_lens, blank=0,
                              reduction="none").mean()
        if self.global_step % 10 == 0:
            print(f"Epoch: {self.current_epoch}, Iteration: {self.global_step}, Loss: {ctc_cost.item()}")
        return ctc_cost

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.learning_rate,
                               momentum=self.hparams.momentum, nesterov=True)


def train(cfg):
    pl.seed_everything(cfg["seed"], verbose=False)
    torch.set_num_threads(1)
    corpus = SpokenSpellingCorpus(cfg["n_utterances"], cfg["feat_dim"], cfg["max_words"], seed=cfg["seed"])
    loader = DataLoader(corpus, batch_size=cfg["batch_size"], shuffle=False, collate_fn=pad_batch)
    model = SpeechGRU(cfg["feat_dim"], cfg["nodes"], cfg["recur_layers"], cfg["conv_context"],
                      cfg["conv_stride"], cfg["learning_rate"], cfg["momentum"])
    trainer = pl.Trainer(max_epochs=cfg["epochs"], accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)


if __name__ == "__main__":
    train(CONFIG)
