"""SimVP-style spatio-temporal forecasting of daily sea-surface temperature.

The regional SST cube is stored like a netCDF variable (packed int16 with
scale_factor / add_offset / _FillValue) and opened with an xarray-like reader
that applies mask-and-scale.  A WeatherBench-style Dataset normalises the
field and cuts (10 in -> 10 out) frame windows; the model is trained with
PyTorch Lightning.
"""
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
import lightning as L

CFG = dict(variable="sst", pre_seq_length=10, aft_seq_length=10, batch_size=8,
           lr=1e-3, epochs=2, hid_S=16, hid_T=64, N_S=2, N_T=2, seed=42)


def write_sst_file(path, n_days=160, h=32, w=32, seed=0):
    """Daily SST over a coastal box; land pixels carry the _FillValue."""
    rng = np.random.default_rng(seed)
    yy, xx = np.meshgrid(np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    t = np.arange(n_days)[:, None, None]
    sst = (18 + 6 * yy + 2.5 * np.sin(2 * np.pi * (t / 365.0 + 0.3 * xx))
           + 0.8 * np.sin(2 * np.pi * (xx - 0.02 * t)) + 0.2 * rng.standard_normal((n_days, h, w)))
    land = (xx + 0.35 * np.sin(4 * yy)) > 0.82
    scale, offset, fill = 0.01, 20.0, -32767
    packed = np.round((sst - offset) / scale).astype(np.int16)
    packed[:, land] = fill
    np.savez(path, sst=packed, scale_factor=scale, add_offset=offset, _FillValue=fill,
             lat=np.linspace(30, 38, h), lon=np.linspace(-12, -4, w))


def open_dataset(path):
    """Minimal stand-in for xr.open_dataset(path): decode packed variables."""
    raw = np.load(path)
    data = raw["sst"].astype(np.float32)
    data[raw["sst"] == raw["_FillValue"]] = np.nan
    data = data * raw["scale_factor"] + raw["add_offset"]
    return {"sst": data.astype(np.float32), "lat": raw["lat"], "lon": raw["lon"]}


class WeatherDataset(Dataset):
    def __init__(self, path, variable, pre, aft, split, mean=None, std=None):
        ds = open_dataset(path)
        data = ds[variable]
        n_train = int(0.8 * len(data))
        data = data[:n_train] if split == "train" else data[n_train - pre - aft:]
        data = data[:, None]                                  # T x C x H x W
        self.mean = data.mean(axis=(0, 2, 3), keepdims=True) if mean is None else mean
        self.std = data.std(axis=(0, 2, 3), keepdims=True) if std is None else std
        self.data = ((data - self.mean) / self.std).astype(np.float32)
        self.pre, self.aft = pre, aft
        self.valid_idx = np.arange(len(self.data) - pre - aft + 1)

    def __len__(self):
        return len(self.valid_idx)

    def __getitem__(self, i):
        t = self.valid_idx[i]
        x = torch.from_numpy(self.data[t:t + self.pre])
        y = torch.from_numpy(self.data[t + self.pre:t + self.pre + self.aft])
        return x, y


class ConvSC(nn.Module):
    def __init__(self, c_in, c_out, stride=1, transpose=False):
        super().__init__()
        if transpose and stride > 1:
            self.conv = nn.ConvTranspose2d(c_in, c_out, 3, stride, 1, output_padding=stride - 1)
        else:
            self.conv = nn.Conv2d(c_in, c_out, 3, stride, 1)
        self.norm = nn.GroupNorm(2, c_out)

    def forward(self, x):
        return F.silu(self.norm(self.conv(x)))


class Encoder(nn.Module):
    def __init__(self, c_in, c_hid, n_s):
        super().__init__()
        strides = [1, 2] * (n_s // 2)
        self.layers = nn.ModuleList([ConvSC(c_in if i == 0 else c_hid, c_hid, s) for i, s in enumerate(strides)])

    def forward(self, x):
        skip = x = self.layers[0](x)
        for layer in self.layers[1:]:
            x = layer(x)
        return x, skip


class Decoder(nn.Module):
    def __init__(self, c_hid, c_out, n_s):
        super().__init__()
        strides = list(reversed([1, 2] * (n_s // 2)))
        self.layers = nn.ModuleList([ConvSC(c_hid, c_hid, s, transpose=True) for s in strides[:-1]])
        self.last = ConvSC(2 * c_hid, c_hid, 1)
        self.readout = nn.Conv2d(c_hid, c_out, 1)

    def forward(self, hid, skip):
        for layer in self.layers:
            hid = layer(hid)
        return self.readout(self.last(torch.cat([hid, skip], 1)))


class Translator(nn.Module):
    def __init__(self, c_in, c_hid, n_t):
        super().__init__()
        layers = []
        for i in range(n_t):
            layers += [nn.Conv2d(c_in if i == 0 else c_hid, c_hid, 3, 1, 1), nn.GroupNorm(4, c_hid), nn.SiLU()]
        layers.append(nn.Conv2d(c_hid, c_in, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, z):
        return self.net(z)


class SimVP(L.LightningModule):
    def __init__(self, in_shape, hid_S, hid_T, N_S, N_T, lr, aft):
        super().__init__()
        self.save_hyperparameters()
        T, C, H, W = in_shape
        self.enc = Encoder(C, hid_S, N_S)
        self.hid = Translator(T * hid_S, hid_T, N_T)
        self.dec = Decoder(hid_S, C, N_S)
        self.criterion = nn.MSELoss()

    def forward(self, x):
        B, T, C, H, W = x.shape
        embed, skip = self.enc(x.reshape(B * T, C, H, W))
        _, C_, H_, W_ = embed.shape
        z = self.hid(embed.reshape(B, T * C_, H_, W_)).reshape(B * T, C_, H_, W_)
        y = self.dec(z, skip)
        return y.reshape(B, T, C, H, W)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.criterion(self(x), y)
        if batch_idx % 2 == 0:
            print(f"epoch {self.current_epoch} step {self.global_step:3d} train_loss {loss.item():.5f}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", self.criterion(self(x), y), prog_bar=False)

    def on_validation_epoch_end(self):
        print(f"epoch {self.current_epoch} val_loss {self.trainer.callback_metrics['val_loss'].item():.5f}")

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.lr,
                                                    total_steps=self.trainer.estimated_stepping_batches)
        return [opt], [{"scheduler": sched, "interval": "step"}]


def main():
    L.seed_everything(CFG["seed"], verbose=False)
    workdir = tempfile.mkdtemp(prefix="sst_")
    path = os.path.join(workdir, "sst_daily_box.npz")
    write_sst_file(path)

    pre, aft = CFG["pre_seq_length"], CFG["aft_seq_length"]
    train_set = WeatherDataset(path, CFG["variable"], pre, aft, "train")
    val_set = WeatherDataset(path, CFG["variable"], pre, aft, "val", train_set.mean, train_set.std)
    train_loader = DataLoader(train_set, batch_size=CFG["batch_size"], shuffle=True)
    val_loader = DataLoader(val_set, batch_size=CFG["batch_size"])

    x0, _ = train_set[0]
    model = SimVP(tuple(x0.shape), CFG["hid_S"], CFG["hid_T"], CFG["N_S"], CFG["N_T"], CFG["lr"], aft)
    trainer = L.Trainer(max_epochs=CFG["epochs"], accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=workdir)
    trainer.fit(model, train_loader, val_loader)


if __name__ == "__main__":
    main()
