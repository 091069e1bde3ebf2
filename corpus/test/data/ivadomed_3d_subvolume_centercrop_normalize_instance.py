"""3D spinal-cord segmentation on MRI subvolumes, ivadomed-style pipeline.

Setting: T2w volumes of different lengths are brought to a common shape by a
`CenterCrop` preprocessing transform (ivadomed's crop zero-pads when the
requested size exceeds the volume), cut into 16x16x16 subvolumes by an
`MRI3DSubVolumeSegmentationDataset`, and every subvolume goes through the
training transforms (`RandomReverse`, `NumpyToTensor`, `NormalizeInstance`)
in `__getitem__` before a small 3D U-Net is trained with the Dice loss.

Bug: `NormalizeInstance` computes `(sample - sample.mean()) / sample.std()`
with no guard.  One subject (sub-11) was acquired with a short
superior-inferior coverage (17 slices), so the centre crop to 48 slices pads
it with zeros and the first of its three subvolumes is entirely zero: its std
is exactly 0 and the normalised input is 0/0 = NaN.  The other 47 subvolumes
are fine, so training runs normally until the first batch that draws the
empty subvolume (iteration 10 of 12 in epoch 1); the loss is then nan, Adam
writes NaN into every weight and every later loss is nan.

Fix (ivadomed PR #1267, "Fix NormalizeInstance for uniform samples", fixing
issue #1245): if the sample is uniform (std < 1e-5) only subtract the mean,
otherwise normalise as before.

Report: https://github.com/ivadomed/ivadomed/issues/1245
"""
import logging
import sys

import numpy as np
import torch
import torch.nn as nn

logger = logging.getLogger("ivadomed-like")

CONFIG = {
    "seed": 23,
    "loader_parameters": {"target_suffix": ["_seg-manual"], "contrast": "T2w"},
    "Modified3DUNet": {"length_3D": [16, 16, 16], "stride_3D": [16, 16, 16], "n_filters": 4},
    "training_parameters": {"batch_size": 4, "num_epochs": 4, "initial_lr": 3e-3, "log_interval": 3},
    "transformation": {
        "CenterCrop": {"size": [16, 16, 48], "preprocessing": True, "applied_to": ["im", "gt"]},
        "RandomReverse": {"applied_to": ["im", "gt"], "dataset_type": ["training"]},
        "NumpyToTensor": {"applied_to": ["im", "gt"]},
        "NormalizeInstance": {"applied_to": ["im"]},
    },
    # subject id -> number of axial slices in the acquisition
    "subjects_train": {f"sub-{i:02d}": n for i, n in enumerate(
        [56, 60, 52, 64, 48, 58, 50, 62, 54, 60, 17, 56, 52, 64, 58, 50], start=1)},
    "subjects_valid": {"sub-17": 56, "sub-18": 60, "sub-19": 52, "sub-20": 64},
}


# ----------------------------------------------------------------------------- data
def synthesize_subject(n_slices, rng, shape_xy=(24, 24)):
    """Fake T2w volume (CSF bright, cord darker) and its manual cord segmentation."""
    h, w = shape_xy
    xx, yy = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    im = np.empty((h, w, n_slices), dtype=np.float32)
    gt = np.zeros((h, w, n_slices), dtype=np.float32)
    phase = rng.uniform(0, 2 * np.pi)
    for z in range(n_slices):
        cx = h / 2 + 1.5 * np.sin(phase + z / 9.0) + rng.normal(0, 0.3)
        cy = w / 2 + 1.0 * np.cos(phase + z / 11.0) + rng.normal(0, 0.3)
        r = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
        sl = np.full((h, w), 300.0) + 900.0 * (r < 5.0) - 400.0 * (r < 2.5)
        im[..., z] = np.abs(sl + rng.normal(0, 25.0, size=(h, w)))
        gt[..., z] = (r < 2.5).astype(np.float32)
    return im, gt


# ----------------------------------------------------------------------------- transforms
class ImedTransform:
    def __call__(self, sample, metadata=None):
        raise NotImplementedError


class CenterCrop(ImedTransform):
    """Centered crop; zero-pads where the requested size exceeds the volume."""

    def __init__(self, size):
        self.size = size

    def __call__(self, sample, metadata=None):
        out = sample
        for axis, target in enumerate(self.size):
            cur = out.shape[axis]
            start = int(round((cur - target) / 2.0))
            if start >= 0:
                out = np.take(out, range(start, start + target), axis=axis)
            else:
                pad = [(0, 0)] * out.ndim
                pad[axis] = (-start, target - cur + start)
                out = np.pad(out, pad, mode="constant", constant_values=0)
        return out, metadata


class RandomReverse(ImedTransform):
    def __call__(self, sample, metadata=None):
        for axis, flip in enumerate(metadata["reverse"]):
            if flip:
                sample = np.flip(sample, axis=axis)
        return np.ascontiguousarray(sample), metadata


class NumpyToTensor(ImedTransform):
    def __call__(self, sample, metadata=None):
        return torch.from_numpy(np.asarray(sample, dtype=np.float32)).unsqueeze(0), metadata


class NormalizeInstance(ImedTransform):
    """Normalize with mean and standard deviation estimated from the sample itself."""

    def __call__(self, sample, metadata=None):
        data_out = (sample - sample.mean()) / sample.std()
        return data_out, metadata


class Compose:
    def __init__(self, dict_transforms, preprocessing=False, dataset_type="training"):
        self.transform = {"im": [], "gt": []}
        for name, params in dict_transforms.items():
            if params.get("preprocessing", False) != preprocessing:
                continue
            if dataset_type not in params.get("dataset_type", [dataset_type]):
                continue
            kwargs = {k: v for k, v in params.items() if k not in ("applied_to", "dataset_type", "preprocessing")}
            tr = globals()[name](**kwargs)
            for data_type in params.get("applied_to", ["im", "gt"]):
                self.transform[data_type].append(tr)

    def __call__(self, sample, metadata, data_type="im"):
        for tr in self.transform[data_type]:
            sample, metadata = tr(sample, metadata)
        return sample, metadata


# ----------------------------------------------------------------------------- dataset
class MRI3DSubVolumeSegmentationDataset(torch.utils.data.Dataset):
    def __init__(self, subjects, transform_cfg, length, stride, dataset_type, rng):
        self.prepro = Compose(transform_cfg, preprocessing=True)
        self.transform = Compose(transform_cfg, dataset_type=dataset_type)
        self.is_train = dataset_type == "training"
        self.length, self.stride = length, stride
        self.rng = rng
        self.handlers, self.indexes = [], []
        for sub_id, n_slices in subjects.items():
            im, gt = synthesize_subject(n_slices, rng)
            im, _ = self.prepro(im, {}, "im")
            gt, _ = self.prepro(gt, {}, "gt")
            self.handlers.append((sub_id, im, gt))
        self._prepare_indices()

    def _prepare_indices(self):
        for i, (_, im, _) in enumerate(self.handlers):
            shape = im.shape
            for x in range(0, shape[0] - self.length[0] + 1, self.stride[0]):
                for y in range(0, shape[1] - self.length[1] + 1, self.stride[1]):
                    for z in range(0, shape[2] - self.length[2] + 1, self.stride[2]):
                        self.indexes.append({"handler_index": i, "x_min": x, "y_min": y, "z_min": z})

    def __len__(self):
        return len(self.indexes)

    def __getitem__(self, subvolume_index):
        coord = self.indexes[subvolume_index]
        _, im, gt = self.handlers[coord["handler_index"]]
        sl = (slice(coord["x_min"], coord["x_min"] + self.length[0]),
              slice(coord["y_min"], coord["y_min"] + self.length[1]),
              slice(coord["z_min"], coord["z_min"] + self.length[2]))
        flips = self.rng.random(3) < 0.5 if self.is_train else np.zeros(3, dtype=bool)
        metadata = {"reverse": flips}
        input_img, _ = self.transform(im[sl].copy(), dict(metadata), "im")
        gt_img, _ = self.transform(gt[sl].copy(), dict(metadata), "gt")
        return {"input": input_img, "gt": gt_img}


# ----------------------------------------------------------------------------- model / loss
def conv_block(cin, cout):
    return nn.Sequential(
        nn.Conv3d(cin, cout, 3, padding=1), nn.InstanceNorm3d(cout, affine=True), nn.LeakyReLU(0.01),
        nn.Conv3d(cout, cout, 3, padding=1), nn.InstanceNorm3d(cout, affine=True), nn.LeakyReLU(0.01))


class Modified3DUNet(nn.Module):
    def __init__(self, in_channel=1, n_classes=1, n_filters=8):
        super().__init__()
        f = n_filters
        self.enc1, self.enc2, self.bottom = conv_block(in_channel, f), conv_block(f, 2 * f), conv_block(2 * f, 4 * f)
        self.pool = nn.MaxPool3d(2)
        self.up2, self.dec2 = nn.ConvTranspose3d(4 * f, 2 * f, 2, stride=2), conv_block(4 * f, 2 * f)
        self.up1, self.dec1 = nn.ConvTranspose3d(2 * f, f, 2, stride=2), conv_block(2 * f, f)
        self.out = nn.Conv3d(f, n_classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        b = self.bottom(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(b), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return torch.sigmoid(self.out(d1))


class DiceLoss(nn.Module):
    def __init__(self, smooth=1.0):
        super().__init__()
        self.smooth = smooth

    def forward(self, prediction, target):
        iflat, tflat = prediction.reshape(-1), target.reshape(-1)
        intersection = (iflat * tflat).sum()
        return -(2.0 * intersection + self.smooth) / (iflat.sum() + tflat.sum() + self.smooth)


# ----------------------------------------------------------------------------- training
def train(context):
    torch.manual_seed(context["seed"])
    rng = np.random.default_rng(context["seed"])
    mp = context["Modified3DUNet"]
    tp = context["training_parameters"]

    ds_train = MRI3DSubVolumeSegmentationDataset(context["subjects_train"], context["transformation"],
                                                 mp["length_3D"], mp["stride_3D"], "training", rng)
    ds_valid = MRI3DSubVolumeSegmentationDataset(context["subjects_valid"], context["transformation"],
                                                 mp["length_3D"], mp["stride_3D"], "validation", rng)
    logger.info(f"Loaded {len(ds_train)} training and {len(ds_valid)} validation subvolumes")
    g = torch.Generator().manual_seed(context["seed"])
    train_loader = torch.utils.data.DataLoader(ds_train, batch_size=tp["batch_size"], shuffle=True, generator=g)
    val_loader = torch.utils.data.DataLoader(ds_valid, batch_size=tp["batch_size"], shuffle=False)

    model = Modified3DUNet(n_filters=mp["n_filters"])
    optimizer = torch.optim.Adam(model.parameters(), lr=tp["initial_lr"])
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, tp["num_epochs"] * len(train_loader))
    loss_fct = DiceLoss()

    for epoch in range(1, tp["num_epochs"] + 1):
        model.train()
        train_loss_total = 0.0
        for i, batch in enumerate(train_loader):
            preds = model(batch["input"])
            loss = loss_fct(preds, batch["gt"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            train_loss_total += loss.item()
            if (i + 1) % tp["log_interval"] == 0:
                logger.info(f"Epoch {epoch} [{i + 1}/{len(train_loader)}] training loss: {loss.item():.4f}")
        model.eval()
        val_loss_total = 0.0
        with torch.no_grad():
            for batch in val_loader:
                val_loss_total += loss_fct(model(batch["input"]), batch["gt"]).item()
        logger.info(f"Epoch {epoch} training loss: {train_loss_total / len(train_loader):.4f} "
                    f"validation loss: {val_loss_total / len(val_loader):.4f}")


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
    train(CONFIG)
