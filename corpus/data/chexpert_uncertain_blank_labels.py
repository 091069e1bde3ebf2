"""Multi-label chest X-ray classifier on a CheXpert-style label table.

The label table is exported as CSV (Path,Sex,Age,Frontal/Lateral,AP/PA + five
competition pathologies). Uncertain findings (-1) are mapped to positive
(the "U-Ones" policy); images here are small synthetic 32x32 crops.
"""
import argparse
import io

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

PATHOLOGIES = ["Atelectasis", "Cardiomegaly", "Consolidation", "Edema", "Pleural Effusion"]


def make_label_csv(n_rows, seed=0):
    rng = np.random.RandomState(seed)
    header = "Path,Sex,Age,Frontal/Lateral,AP/PA," + ",".join(PATHOLOGIES)
    lines = [header]
    for i in range(n_rows):
        sex = "Male" if rng.rand() < 0.5 else "Female"
        age = rng.randint(18, 90)
        cells = []
        for _ in PATHOLOGIES:
            r = rng.rand()
            if r < 0.25:
                cells.append("1.0")
            elif r < 0.55:
                cells.append("0.0")
            elif r < 0.65:
                cells.append("-1.0")
            elif r < 0.997:
                cells.append("0.0")
            else:
                cells.append("")
        lines.append(f"train/patient{i:05d}/study1/view1_frontal.jpg,{sex},{age},Frontal,AP," + ",".join(cells))
    return "\n".join(lines) + "\n"


class ChexpertCrops(Dataset):
    def __init__(self, csv_text, policy="ones"):
        table = np.genfromtxt(io.StringIO(csv_text), delimiter=",", skip_header=1,
                              usecols=range(5, 5 + len(PATHOLOGIES)))
        labels = table.astype(np.float32)
        if policy == "ones":
            labels[labels == -1] = 1.0
        else:
            labels[labels == -1] = 0.0
        self.labels = torch.from_numpy(labels)
        g = torch.Generator().manual_seed(1)
        self.images = torch.randn(len(labels), 1, 32, 32, generator=g) * 0.5

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        return self.images[idx], self.labels[idx]


class SmallDenseNetish(nn.Module):
    def __init__(self, n_out):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(64, n_out)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def train(args):
    torch.manual_seed(args.seed)
    ds = ChexpertCrops(make_label_csv(args.rows, seed=args.seed), policy=args.policy)
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True)
    model = SmallDenseNetish(len(PATHOLOGIES))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.999))
    criterion = nn.BCEWithLogitsLoss()
    step = 0
    for epoch in range(args.epochs):
        model.train()
        running = 0.0
        for images, labels in loader:
            logits = model(images)
            loss = criterion(logits, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            running += loss.item()
            step += 1
            if step % 2 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
        print(f"epoch {epoch} mean loss {running / len(loader):.4f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=1200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--policy", default="ones", choices=["ones", "zeros"])
    p.add_argument("--seed", type=int, default=0)
    train(p.parse_args())


if __name__ == "__main__":
    main()
