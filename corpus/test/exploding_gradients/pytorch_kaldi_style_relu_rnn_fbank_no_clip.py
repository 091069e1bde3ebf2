"""Frame-level acoustic model in the style of pytorch-kaldi (run_exp.py / core.py / neural_networks.py):
an INI config with [exp] / [dataset1] / [batches] / [architectureN] sections drives the run,
fbank features with context-dependent state labels (ali-to-pdf) are read per chunk, utterances
are split into sequences of at most `seq_len` frames with the training sequence length doubled
every epoch (increase_seq_length_train), an RNN_layers architecture (the library's RNN class:
BatchNorm on the input projection, orthogonally initialised recurrent matrix, ReLU activation)
feeds an MLP_layers softmax, `cost_nll` is the loss, and every architecture has its own
optimizer.

The features here are synthetic (per-state spectral templates + noise, global CMVN).

Bug: the ReLU recurrence is unbounded and the optimizer step in run_nn has no gradient clipping
(in core.py the "Gradient Clipping (th 0.1)" lines were commented out).  Training is fine on the
50-frame chunks of the first epoch; on the 100-frame chunks of the second epoch the recurrent
matrix tips over, one batch's gradient norm jumps to ~2e3, the SGD step throws the weights out
and the loss is nan from there on.

Report: https://github.com/mravanelli/pytorch-kaldi/issues/112  ("Got loss nan at last iteration";
the maintainer's answer: activate gradient clipping by uncommenting the lines in core.py)
Fix: clip after backward, before the optimizer steps:
    for net in nns.keys(): torch.nn.utils.clip_grad_norm_(nns[net].parameters(), 0.1)
"""
import argparse
import configparser
import random
import time

import numpy as np
import torch
import torch.nn as nn

CFG = """
[exp]
seed = 1234
n_epochs_tr = 4

[dataset1]
data_name = train_clean_100
fea_name = fbank
n_fbank = 20
n_utt = 32
lab_name = lab_cd
n_states = 24

[batches]
batch_size_train = 8
increase_seq_length_train = True
start_seq_len_train = 50
multply_factor_seq_len_train = 2
max_seq_length_train = 400

[architecture1]
arch_name = RNN_layers
arch_seq_model = True
rnn_lay = 48,48
rnn_use_batchnorm = True,True
rnn_act = relu,relu
rnn_orthinit = True
arch_lr = 0.6
arch_opt = sgd
opt_momentum = 0.0

[architecture2]
arch_name = MLP_layers
arch_seq_model = False
dnn_lay = N_out_lab_cd
arch_lr = 0.08
arch_opt = sgd
opt_momentum = 0.0
"""


def strtobool(v):
    return v.strip().lower() in ("1", "true", "yes", "on")


def read_lab_fea(config, rng):
    """Synthetic stand-in for the fbank feats.scp + tri-state alignments of one chunk."""
    n_fea = int(config["dataset1"]["n_fbank"])
    n_states = int(config["dataset1"]["n_states"])
    centers = rng.randn(n_states, n_fea) * 1.2
    utts = []
    for u in range(int(config["dataset1"]["n_utt"])):
        n_frames = int(rng.randint(60, 300))
        lab = []
        phone = rng.randint(n_states // 3)
        while len(lab) < n_frames:
            for s in range(3):  # three HMM states per phone
                lab += [3 * phone + s] * int(rng.randint(2, 6))
            phone = rng.randint(n_states // 3)
        lab = np.array(lab[:n_frames])
        fea = centers[lab] + 0.9 * rng.randn(n_frames, n_fea)
        drift = np.cumsum(rng.randn(n_frames, 1), 0) / np.sqrt(np.arange(1, n_frames + 1))[:, None]
        fea = fea + 0.3 * drift
        utts.append(("utt%03d" % u, fea.astype(np.float32), lab.astype(np.int64)))
    allfea = np.concatenate([f for _, f, _ in utts])
    mean, std = allfea.mean(0), allfea.std(0)  # global CMVN
    return [(name, (f - mean) / std, l) for name, f, l in utts]


def split_sentences(utts, max_len):
    """Split utterances longer than max_len frames (sequential models), sorted by length."""
    out = []
    for name, fea, lab in utts:
        for beg in range(0, len(lab), max_len):
            out.append((name, fea[beg:beg + max_len], lab[beg:beg + max_len]))
    out.sort(key=lambda x: len(x[2]))
    return out


class RNN(nn.Module):
    def __init__(self, options, inp_dim):
        super().__init__()
        self.rnn_lay = list(map(int, options["rnn_lay"].split(",")))
        self.rnn_use_batchnorm = list(map(strtobool, options["rnn_use_batchnorm"].split(",")))
        self.rnn_act = options["rnn_act"].split(",")
        self.wh = nn.ModuleList()
        self.uh = nn.ModuleList()
        self.bn_wh = nn.ModuleList()
        current_input = inp_dim
        for i, n_hid in enumerate(self.rnn_lay):
            self.wh.append(nn.Linear(current_input, n_hid, bias=not self.rnn_use_batchnorm[i]))
            self.uh.append(nn.Linear(n_hid, n_hid, bias=False))
            if strtobool(options["rnn_orthinit"]):
                nn.init.orthogonal_(self.uh[i].weight)
            self.bn_wh.append(nn.BatchNorm1d(n_hid, momentum=0.05))
            current_input = n_hid
        self.out_dim = current_input

    def forward(self, x):
        for i in range(len(self.rnn_lay)):
            wh_out = self.wh[i](x)
            if self.rnn_use_batchnorm[i]:
                T, B, H = wh_out.shape
                wh_out = self.bn_wh[i](wh_out.reshape(T * B, H)).reshape(T, B, H)
            act = torch.relu if self.rnn_act[i] == "relu" else torch.tanh
            ht = torch.zeros(x.shape[1], self.rnn_lay[i])
            hiddens = []
            for k in range(x.shape[0]):
                ht = act(wh_out[k] + self.uh[i](ht))
                hiddens.append(ht)
            x = torch.stack(hiddens)
        return x


class MLP(nn.Module):
    def __init__(self, inp_dim, n_out):
        super().__init__()
        self.fc = nn.Linear(inp_dim, n_out)

    def forward(self, x):
        return torch.log_softmax(self.fc(x), dim=-1)


def optimizer_init(nns, config, arch_dict):
    optimizers = {}
    for net, sec in arch_dict.items():
        opts = config[sec]
        if opts["arch_opt"] == "sgd":
            optimizers[net] = torch.optim.SGD(nns[net].parameters(), lr=float(opts["arch_lr"]),
                                              momentum=float(opts["opt_momentum"]))
        elif opts["arch_opt"] == "rmsprop":
            optimizers[net] = torch.optim.RMSprop(nns[net].parameters(), lr=float(opts["arch_lr"]))
        else:
            optimizers[net] = torch.optim.Adam(nns[net].parameters(), lr=float(opts["arch_lr"]))
    return optimizers


def run_nn(data_set, nns, optimizers, seq_len, ep, batch_size):
    sentences = split_sentences(data_set, seq_len)
    cost_nll = nn.NLLLoss(ignore_index=-1)
    loss_sum, err_sum = 0.0, 0.0
    N_batches = len(sentences) // batch_size
    for i in range(N_batches):
        batch = sentences[i * batch_size:(i + 1) * batch_size]
        max_len = max(len(lab) for _, _, lab in batch)
        inp = torch.zeros(max_len, batch_size, batch[0][1].shape[1])
        ref = torch.full((max_len, batch_size), -1, dtype=torch.long)
        for k, (_, fea, lab) in enumerate(batch):
            inp[:len(lab), k] = torch.from_numpy(fea)
            ref[:len(lab), k] = torch.from_numpy(lab)

        out_dnn1 = nns["RNN_layers"](inp)
        out_dnn2 = nns["MLP_layers"](out_dnn1)
        loss_final = cost_nll(out_dnn2.reshape(-1, out_dnn2.shape[-1]), ref.reshape(-1))
        pred = out_dnn2.argmax(-1)
        err_final = ((pred != ref) & (ref >= 0)).sum().float() / (ref >= 0).sum()

        for opt in optimizers.keys():
            optimizers[opt].zero_grad()
        loss_final.backward()
        for opt in optimizers.keys():
            optimizers[opt].step()

        loss_sum += loss_final.item()
        err_sum += err_final.item()
        print("ep=%02d Training | (Batch %d/%d) | seq_len=%d | L:%.3f | loss=%.4f err=%.3f"
              % (ep, i + 1, N_batches, seq_len, loss_sum / (i + 1), loss_final.item(), err_final.item()),
              flush=True)
    return loss_sum / N_batches, err_sum / N_batches


def main():
    parser = argparse.ArgumentParser(description="pytorch-kaldi style RNN acoustic model")
    parser.add_argument("--cfg", default=None, help="optional config file overriding the built-in one")
    parser.add_argument("--n_epochs", type=int, default=None)
    args = parser.parse_args()

    config = configparser.ConfigParser()
    config.read_string(CFG)
    if args.cfg:
        config.read(args.cfg)

    seed = int(config["exp"]["seed"])
    torch.manual_seed(seed)
    random.seed(seed)
    rng = np.random.RandomState(seed)

    data_set = read_lab_fea(config, rng)
    inp_dim = data_set[0][1].shape[1]
    arch_dict = {"RNN_layers": "architecture1", "MLP_layers": "architecture2"}
    nns = {"RNN_layers": RNN(config["architecture1"], inp_dim)}
    nns["MLP_layers"] = MLP(nns["RNN_layers"].out_dim, int(config["dataset1"]["n_states"]))
    optimizers = optimizer_init(nns, config, arch_dict)

    N_ep = args.n_epochs or int(config["exp"]["n_epochs_tr"])
    seq_len = int(config["batches"]["start_seq_len_train"])
    for ep in range(N_ep):
        start = time.time()
        tr_loss, tr_err = run_nn(data_set, nns, optimizers, seq_len, ep,
                                 int(config["batches"]["batch_size_train"]))
        print("ep=%02d tr=['%s'] loss=%.3f err=%.3f lr_architecture1=%s lr_architecture2=%s time(s)=%d"
              % (ep, config["dataset1"]["data_name"], tr_loss, tr_err,
                 config["architecture1"]["arch_lr"], config["architecture2"]["arch_lr"],
                 time.time() - start), flush=True)
        if strtobool(config["batches"]["increase_seq_length_train"]):
            seq_len = min(seq_len * int(config["batches"]["multply_factor_seq_len_train"]),
                          int(config["batches"]["max_seq_length_train"]))


if __name__ == "__main__":
    main()
