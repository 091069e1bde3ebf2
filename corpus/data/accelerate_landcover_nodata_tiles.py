"""Land-cover semantic segmentation of 4-band satellite tiles with Accelerate.

A synthetic "scene" (blue, green, red, near-infrared reflectances) is cut into
32x32 training tiles, the way geo-deep-learning writes its samples to HDF5.  Parts
of the scene lie outside the sensor swath; the GeoTIFF reader returns those
pixels as NaN (nodata).  Band statistics are computed with nanmean / nanstd and a
small fully-convolutional network is trained with cross-entropy over 3 classes
(water, vegetation, built-up).
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from accelerate import Accelerator
from accelerate.utils import set_seed

PARAMS = {
    "scene_size": 512,
    "tile": 32,
    "batch_size": 8,
    "grad_accum": 2,
    "epochs": 1,
    "lr": 1e-3,
    "num_classes": 3,
    "seed": 5,
}


def make_scene(size, rng):
    """Reflectance image (4, H, W) plus a label map, with a nodata wedge at the swath edge."""
    yy, xx = np.mgrid[0:size, 0:size] / size
    field = np.sin(6 * xx + 2 * np.sin(5 * yy)) + 0.5 * np.cos(9 * yy)
    labels = np.digitize(field, [-0.4, 0.5]).astype(np.int64)        # 0 water, 1 vegetation, 2 built-up
    means = np.array([[0.05, 0.04, 0.03, 0.02], [0.04, 0.08, 0.05, 0.40], [0.12, 0.13, 0.14, 0.20]])
    image = means[labels].transpose(2, 0, 1) + 0.01 * rng.standard_normal((4, size, size))
    swath_edge = (xx + 0.35 * yy) > 1.3
    image[:, swath_edge] = np.nan
    return image.astype(np.float32), labels


class TileDataset(Dataset):
    def __init__(self, image, labels, tile, mean, std):
        self.image, self.labels, self.tile = image, labels, tile
        self.mean, self.std = mean[:, None, None], std[:, None, None]
        n = image.shape[-1] // tile
        self.index = [(r * tile, c * tile) for r in range(n) for c in range(n)]

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        r, c = self.index[i]
        t = self.tile
        sat_img = (self.image[:, r:r + t, c:c + t] - self.mean) / self.std
        map_img = self.labels[r:r + t, c:c + t]
        return {"sat_img": torch.from_numpy(sat_img.astype(np.float32)), "map_img": torch.from_numpy(map_img)}


class SmallFCN(nn.Module):
    def __init__(self, in_ch=4, num_classes=3, width=24):
        super().__init__()
        def cbr(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True))
        self.enc1 = cbr(in_ch, width)
        self.enc2 = nn.Sequential(nn.MaxPool2d(2), cbr(width, 2 * width))
        self.dec = cbr(3 * width, width)
        self.head = nn.Conv2d(width, num_classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = F.interpolate(self.enc2(e1), scale_factor=2, mode="bilinear", align_corners=False)
        return self.head(self.dec(torch.cat([e1, e2], dim=1)))


def main():
    p = PARAMS
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=p["grad_accum"])
    set_seed(p["seed"])
    rng = np.random.default_rng(p["seed"])

    image, labels = make_scene(p["scene_size"], rng)
    mean = np.nanmean(image, axis=(1, 2))
    std = np.nanstd(image, axis=(1, 2))
    accelerator.print("band means", np.round(mean, 4), "band stds", np.round(std, 4))

    dataset = TileDataset(image, labels, p["tile"], mean, std)
    loader = DataLoader(dataset, batch_size=p["batch_size"], shuffle=True, drop_last=True)
    model = SmallFCN(num_classes=p["num_classes"])
    optimizer = torch.optim.Adam(model.parameters(), lr=p["lr"])
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    criterion = nn.CrossEntropyLoss()

    step = 0
    for epoch in range(p["epochs"]):
        model.train()
        running = 0.0
        for batch in loader:
            with accelerator.accumulate(model):
                outputs = model(batch["sat_img"])
                loss = criterion(outputs, batch["map_img"])
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            running += loss.item()
            step += 1
            if step % 4 == 0:
                accelerator.print(f"epoch {epoch} batch {step:3d}  train loss {running / 4:.4f}")
                running = 0.0
        accelerator.print(f"epoch {epoch} done")


if __name__ == "__main__":
    main()
