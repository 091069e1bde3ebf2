"""Rainfall-runoff LSTM over many gauged basins, NeuralHydrology style, trained with Lightning.

The run is described by a NeuralHydrology-like config (dynamic inputs incl. agricultural and
developed land-use fractions, static catchment attributes, seq_length, predict_last_n, a GMM head
with a mixture negative log-likelihood, Adam with an epoch-keyed `learning_rate` dict,
clip_gradient_norm); the model is NeuralHydrology's CustomLSTM (an LSTM cell unrolled over the
input window) with initial forget bias and output dropout, and the GMM head (mu, sigma = exp(.) +
eps, pi = softmax(.)).  As in NeuralHydrology's trainer, a NaN loss stops the run with "Loss was
NaN for 1 times in a row. Stopped training."  Forcings, land use and discharge of the basins are
simulated here (a small bucket model); inputs and target are standardised with global statistics.

Bug: the learning rate, 0.2, is far above what this model tolerates (NeuralHydrology's example
configs start at 1e-2 and decay to 1e-3).  Adam moves every weight by about the learning rate per
step whatever the gradient norm, so the clip at 1 does not help: the loss keeps spiking (epoch
averages in the millions) while the per-batch loss hovers around 1, until in the third epoch the
head's log-sigma output is thrown far enough that exp() overflows, sigma is inf and the next loss
is nan.

Report: https://github.com/neuralhydrology/neuralhydrology/issues/101 (LSTM on ~800 GAGES-II
basins with agricultural land-use dynamic inputs, "Loss was NaN for 1 times in a row. Stopped
training." in epoch 2; after the maintainer's answer the reporter: "Lowering the learning rate
solved the problem, 350+ epochs with no error")
Fix: lower the learning rate, e.g. learning_rate: {0: 1e-2} (or 1e-3).
"""
import math

import lightning as L
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

# --- run configuration (keys as in a NeuralHydrology .yml) -----------------------------------
cfg = {
    "experiment_name": "land_use_gages_k12",
    "model": "customlstm",
    "head": "gmm",
    "n_distributions": 3,
    "loss": "GMMLoss",
    "hidden_size": 32,
    "initial_forget_bias": 3,
    "output_dropout": 0.4,
    "optimizer": "Adam",
    "learning_rate": {0: 0.2},
    "batch_size": 32,
    "epochs": 4,
    "clip_gradient_norm": 1,
    "seq_length": 30,
    "predict_last_n": 1,
    "dynamic_inputs": ["prcp", "tmax", "pet", "ag_frac", "dev_frac"],
    "static_attributes": ["area", "slope", "k_base", "clay_frac"],
    "target_variables": ["QObs"],
    "n_basins": 8,
    "n_days": 400,
    "seed": 9,
    "log_interval": 10,
}


def simulate_basins(n_basins, n_days, seed):
    """Daily forcings, land-use fractions and streamflow of GAGES-II-like basins (a bucket model)."""
    rng = np.random.default_rng(seed)
    day = np.arange(n_days)
    season = np.sin(2 * np.pi * (day - 100) / 365.25)
    dyn, stat, q = [], [], []
    for b in range(n_basins):
        prcp = rng.gamma(0.5, 6.0, n_days) * (1 + 0.4 * season)
        tmax = 14 + 11 * season + rng.normal(0, 3, n_days)
        pet = np.clip(0.15 * tmax + 0.5, 0, None)
        ag0 = rng.uniform(0.2, 0.8)
        ag_frac = np.clip(ag0 + np.linspace(0, rng.uniform(0.0, 0.15), n_days), 0, 1)
        dev_frac = np.full(n_days, rng.uniform(0.0, 0.2))
        area, slope, k_base, clay = rng.lognormal(5, 1), rng.uniform(1, 30), rng.uniform(0.03, 0.25), rng.uniform(0.1, 0.5)
        storage, flow = 30.0, np.zeros(n_days)
        for t in range(n_days):
            runoff_coef = 0.2 + 0.5 * ag_frac[t] + 0.6 * dev_frac[t]
            storage += (1 - runoff_coef) * prcp[t] - 0.6 * pet[t]
            storage = max(storage, 0.0)
            base = k_base * storage
            storage -= base
            flow[t] = base + runoff_coef * prcp[t] * (1 - clay)
        flow = flow + rng.gamma(1.0, 0.05, n_days)
        dyn.append(np.stack([prcp, tmax, pet, ag_frac, dev_frac], -1))
        stat.append([np.log(area), slope, k_base, clay])
        q.append(flow)
    return np.array(dyn, np.float32), np.array(stat, np.float32), np.array(q, np.float32)


class BasinDataset(Dataset):
    """One sample = seq_length days of dynamic inputs (+ static attributes) -> discharge on the last day."""

    def __init__(self, cfg):
        dyn, stat, q = simulate_basins(cfg["n_basins"], cfg["n_days"], cfg["seed"])
        # scaler: global centering / scaling of inputs and target (NeuralHydrology's train_data_scaler)
        self.x_d = (dyn - dyn.reshape(-1, dyn.shape[-1]).mean(0)) / dyn.reshape(-1, dyn.shape[-1]).std(0)
        self.x_s = (stat - stat.mean(0)) / stat.std(0)
        self.y = (q - q.mean()) / q.std()
        self.seq_length = cfg["seq_length"]
        self.lookup = [(b, t) for b in range(cfg["n_basins"]) for t in range(self.seq_length, cfg["n_days"])]

    def __len__(self):
        return len(self.lookup)

    def __getitem__(self, i):
        b, t = self.lookup[i]
        x_d = torch.from_numpy(self.x_d[b, t - self.seq_length:t])
        x_s = torch.from_numpy(self.x_s[b]).expand(self.seq_length, -1)
        return {"x_d": x_d, "x_s": x_s, "y": torch.tensor([self.y[b, t - 1]])}


class GMM(nn.Module):
    """Gaussian mixture head: mu, sigma = exp(.), pi = softmax(.)."""

    def __init__(self, n_in, n_out, n_hidden=100):
        super().__init__()
        self.fc1 = nn.Linear(n_in, n_hidden)
        self.fc2 = nn.Linear(n_hidden, n_out)
        self._eps = 1e-5

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        mu, sigma, pi = self.fc2(h).chunk(3, dim=-1)
        return {"mu": mu, "sigma": torch.exp(sigma) + self._eps, "pi": torch.softmax(pi, dim=-1),
                "log_pi": torch.log_softmax(pi, dim=-1)}


class _LSTMCell(nn.Module):
    """Plain LSTM cell, unrolled in Python (NeuralHydrology's CustomLSTM)."""

    def __init__(self, input_size, hidden_size, initial_forget_bias):
        super().__init__()
        self.hidden_size = hidden_size
        self.w_ih = nn.Parameter(torch.empty(input_size, 4 * hidden_size))
        self.w_hh = nn.Parameter(torch.empty(hidden_size, 4 * hidden_size))
        self.b_ih = nn.Parameter(torch.zeros(4 * hidden_size))
        self.b_hh = nn.Parameter(torch.zeros(4 * hidden_size))
        k = 1 / math.sqrt(hidden_size)
        for w in (self.w_ih, self.w_hh):
            nn.init.uniform_(w, -k, k)
        with torch.no_grad():
            self.b_hh[hidden_size:2 * hidden_size] = initial_forget_bias

    def forward(self, x_t, h_0, c_0):
        gates = h_0 @ self.w_hh + self.b_hh + x_t @ self.w_ih + self.b_ih
        i, f, g, o = gates.chunk(4, 1)
        c_1 = torch.sigmoid(f) * c_0 + torch.sigmoid(i) * torch.tanh(g)
        h_1 = torch.sigmoid(o) * torch.tanh(c_1)
        return h_1, c_1


class CustomLSTM(L.LightningModule):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        n_in = len(cfg["dynamic_inputs"]) + len(cfg["static_attributes"])
        self.cell = _LSTMCell(n_in, cfg["hidden_size"], cfg["initial_forget_bias"])
        self.dropout = nn.Dropout(cfg["output_dropout"])
        self.head = GMM(cfg["hidden_size"], 3 * cfg["n_distributions"])

    def forward(self, batch):
        x = torch.cat([batch["x_d"], batch["x_s"]], dim=-1).transpose(0, 1)  # [seq, batch, features]
        h = x.new_zeros(x.shape[1], self.cfg["hidden_size"])
        c = x.new_zeros(x.shape[1], self.cfg["hidden_size"])
        for x_t in x:
            h, c = self.cell(x_t, h, c)
        return self.head(self.dropout(h.unsqueeze(1)))

    def gmm_loss(self, pred, y):
        y = y.unsqueeze(-1)  # [B, 1, 1] against [B, 1, K]
        log_prob = -0.5 * ((y - pred["mu"]) / pred["sigma"]) ** 2 - torch.log(pred["sigma"]) - 0.5 * math.log(2 * math.pi)
        return -torch.logsumexp(log_prob + pred["log_pi"], dim=-1).mean()

    def on_train_epoch_start(self):
        self._epoch_losses = []

    def on_train_epoch_end(self):
        print(f"Epoch {self.current_epoch + 1} average loss: avg_loss: {np.mean(self._epoch_losses):.5f}", flush=True)

    def training_step(self, batch, batch_idx):
        pred = self(batch)
        loss = self.gmm_loss(pred, batch["y"])
        self._epoch_losses.append(loss.item())
        step = self.global_step
        if step % self.cfg["log_interval"] == 0 or not torch.isfinite(loss):
            lr = self.optimizers().param_groups[0]["lr"]
            print(f"# Epoch {self.current_epoch + 1}, step {step}: Loss: {loss.item():.4f}, lr: {lr:g}", flush=True)
        if torch.isnan(loss):
            raise RuntimeError("Loss was NaN for 1 times in a row. Stopped training.")
        return loss

    def configure_optimizers(self):
        lr_dict = self.cfg["learning_rate"]
        optimizer = torch.optim.Adam(self.parameters(), lr=lr_dict[0])

        def lr_at_epoch(epoch):
            key = max(k for k in lr_dict if k <= epoch)
            return lr_dict[key] / lr_dict[0]

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at_epoch)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


def start_training(cfg):
    torch.set_num_threads(1)  # many small basins-batches: one thread per run (several runs share a node)
    L.seed_everything(cfg["seed"], verbose=False)
    ds = BasinDataset(cfg)
    loader = DataLoader(ds, batch_size=cfg["batch_size"], shuffle=True,
                        generator=torch.Generator().manual_seed(cfg["seed"]))
    model = CustomLSTM(cfg)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=cfg["epochs"],
        gradient_clip_val=cfg["clip_gradient_norm"],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    print(f"finished {cfg['experiment_name']}: {trainer.global_step} steps", flush=True)


if __name__ == "__main__":
    start_training(cfg)
