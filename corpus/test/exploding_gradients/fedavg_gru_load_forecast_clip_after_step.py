"""Federated (FedAvg) short-term load forecasting with a GRU, simulated in one process.

Each client is a substation with its own load profile (daily + weekly cycles, a
temperature-driven component and noise).  Clients train the global GRU forecaster
locally for a few epochs, the server averages the weights, and the global model is
evaluated on every client's held-out tail.
"""
import argparse
import copy
import math

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

cfg = {
    "num_clients": 4,
    "num_rounds": 12,
    "num_local_epochs": 1,
    "batch_size": 32,
    "window": 48,
    "horizon": 12,
    "optim": "SGD",
    "optim_args": {"lr": 2.0, "momentum": 0.9},
    "clip_grad": True,
    "clip_value": 1.0,
    "clip_norm": 2,
    "hidden": 32,
    "seed": 0,
}


def make_substation_series(client_id, hours, rng):
    t = np.arange(hours)
    base = 50 + 15 * client_id
    daily = (10 + 3 * client_id) * np.sin(2 * np.pi * (t - 6 - client_id) / 24)
    weekly = 6 * np.sin(2 * np.pi * t / (24 * 7) + client_id)
    temp = 12 + 8 * np.sin(2 * np.pi * t / (24 * 365)) + rng.normal(0, 2, hours).cumsum() * 0.05
    cooling = 1.5 * np.clip(temp - 18, 0, None)
    noise = rng.normal(0, 2.0, hours)
    return (base + daily + weekly + cooling + noise).astype(np.float32)


class WindowDataset(Dataset):
    def __init__(self, series, window, horizon):
        self.series = torch.from_numpy(series)
        self.window, self.horizon = window, horizon

    def __len__(self):
        return len(self.series) - self.window - self.horizon + 1

    def __getitem__(self, i):
        x = self.series[i:i + self.window].unsqueeze(-1)
        y = self.series[i + self.window:i + self.window + self.horizon]
        return x, y


class GRUForecaster(nn.Module):
    def __init__(self, hidden, horizon):
        super().__init__()
        self.gru = nn.GRU(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, horizon)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out[:, -1])


class Client:
    def __init__(self, cid, model, loss_fn, dataloader, test_dataloader, cfg):
        self.id = cid
        self.model = model
        self.loss_fn = loss_fn
        self.dataloader = dataloader
        self.test_dataloader = test_dataloader
        self.cfg = cfg
        self.mean = 0.0
        self.std = 1.0

    def update(self, round_idx):
        optimizer = getattr(torch.optim, self.cfg["optim"])(self.model.parameters(), **self.cfg["optim_args"])
        self.model.train()
        for t in range(self.cfg["num_local_epochs"]):
            train_loss = 0.0
            for it, (data, target) in enumerate(self.dataloader):
                data = (data - self.mean) / self.std
                target = (target - self.mean) / self.std
                optimizer.zero_grad()
                output = self.model(data)
                loss = self.loss_fn(output, target)
                loss.backward()
                optimizer.step()
                train_loss += loss.item()
                if self.cfg["clip_grad"]:
                    torch.nn.utils.clip_grad_norm_(
                        self.model.parameters(),
                        self.cfg["clip_value"],
                        norm_type=self.cfg["clip_norm"],
                    )
                if it % 10 == 0:
                    print(f"  round {round_idx:2d} client {self.id} iter {it:3d} loss {loss.item():.4f}")
            train_loss /= len(self.dataloader)
            print(f"  round {round_idx:2d} client {self.id} local epoch {t + 1} train mse {train_loss:.4f}")
        return copy.deepcopy(self.model.state_dict())

    @torch.no_grad()
    def validate(self):
        self.model.eval()
        total, n = 0.0, 0
        for data, target in self.test_dataloader:
            data = (data - self.mean) / self.std
            target = (target - self.mean) / self.std
            total += self.loss_fn(self.model(data), target).item() * len(data)
            n += len(data)
        return total / n


def fedavg(states, weights):
    avg = copy.deepcopy(states[0])
    for k in avg:
        avg[k] = sum(w * s[k] for s, w in zip(states, weights))
    return avg


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--num_rounds", type=int, default=cfg["num_rounds"])
    parser.add_argument("--seed", type=int, default=cfg["seed"])
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    server_model = GRUForecaster(cfg["hidden"], cfg["horizon"])
    loss_fn = nn.MSELoss()
    clients, weights = [], []
    hours = 24 * 40
    for cid in range(cfg["num_clients"]):
        series = make_substation_series(cid, hours, rng)
        split = int(0.8 * hours)
        train_ds = WindowDataset(series[:split], cfg["window"], cfg["horizon"])
        test_ds = WindowDataset(series[split - cfg["window"]:], cfg["window"], cfg["horizon"])
        train_dl = DataLoader(train_ds, batch_size=cfg["batch_size"], shuffle=True)
        test_dl = DataLoader(test_ds, batch_size=128)
        client = Client(cid, copy.deepcopy(server_model), loss_fn, train_dl, test_dl, cfg)
        client.mean = float(series[:split].mean())
        client.std = float(series[:split].std())
        clients.append(client)
        weights.append(len(train_ds))
    weights = [w / sum(weights) for w in weights]

    for r in range(args.num_rounds):
        global_state = server_model.state_dict()
        local_states = []
        for client in clients:
            client.model.load_state_dict(global_state)
            local_states.append(client.update(r))
        server_model.load_state_dict(fedavg(local_states, weights))
        val = []
        for client in clients:
            client.model.load_state_dict(server_model.state_dict())
            val.append(client.validate())
        print(f"round {r:2d} global test mse per client: " + " ".join(f"{v:.4f}" for v in val)
              + f" | mean {float(np.mean(val)):.4f}")


if __name__ == "__main__":
    main()
