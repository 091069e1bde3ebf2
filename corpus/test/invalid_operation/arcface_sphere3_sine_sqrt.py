"""Train a small face-embedding network with an ArcFace (additive angular margin) head.

The embeddings live on a 3-d unit sphere so that the identity clusters can be
plotted afterwards.  Face descriptors are simulated: each identity has a
prototype vector and every sample is that prototype plus noise.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

CFG = {
    "num_ids": 10,
    "in_dim": 64,
    "embed_dim": 3,
    "samples_per_id": 320,
    "batch_size": 64,
    "epochs": 8,
    "lr": 0.05,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "scale": 30.0,
    "margin": 0.5,
    "log_every": 10,
    "seed": 19,
}


class FaceDescriptorSet(Dataset):
    def __init__(self, num_ids, in_dim, samples_per_id, noise=0.5):
        g = torch.Generator().manual_seed(1234)
        protos = torch.randn(num_ids, in_dim, generator=g)
        labels = torch.arange(num_ids).repeat_interleave(samples_per_id)
        self.x = protos[labels] + noise * torch.randn(len(labels), in_dim, generator=g)
        self.y = labels

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Backbone(nn.Module):
    def __init__(self, in_dim, embed_dim):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(in_dim, 128), nn.PReLU(),
            nn.Linear(128, 128), nn.PReLU(),
            nn.Linear(128, embed_dim),
        )

    def forward(self, x):
        return self.body(x)


class ArcFace(nn.Module):
    def __init__(self, in_features, out_features, s=64.0, m=0.5, easy_margin=False):
        super().__init__()
        self.s = s
        self.m = m
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.xavier_uniform_(self.weight)
        self.easy_margin = easy_margin
        self.cos_m = math.cos(m)
        self.sin_m = math.sin(m)
        self.th = math.cos(math.pi - m)
        self.mm = math.sin(math.pi - m) * m

    def forward(self, embeddings, label):
        cosine = F.linear(F.normalize(embeddings), F.normalize(self.weight))
        sine = torch.sqrt(1.0 - torch.pow(cosine, 2))
        phi = cosine * self.cos_m - sine * self.sin_m
        if self.easy_margin:
            phi = torch.where(cosine > 0, phi, cosine)
        else:
            phi = torch.where(cosine > self.th, phi, cosine - self.mm)
        one_hot = torch.zeros_like(cosine)
        one_hot.scatter_(1, label.view(-1, 1).long(), 1)
        output = (one_hot * phi) + ((1.0 - one_hot) * cosine)
        return output * self.s


def train(cfg):
    torch.manual_seed(cfg["seed"])
    data = FaceDescriptorSet(cfg["num_ids"], cfg["in_dim"], cfg["samples_per_id"])
    loader = DataLoader(data, batch_size=cfg["batch_size"], shuffle=True, drop_last=True)

    backbone = Backbone(cfg["in_dim"], cfg["embed_dim"])
    head = ArcFace(cfg["embed_dim"], cfg["num_ids"], s=cfg["scale"], m=cfg["margin"])
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(
        [{"params": backbone.parameters()}, {"params": head.parameters()}],
        lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["weight_decay"],
    )

    it = 0
    for epoch in range(cfg["epochs"]):
        backbone.train()
        head.train()
        correct, seen = 0, 0
        for x, y in loader:
            feats = backbone(x)
            logits = head(feats, y)
            loss = criterion(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            correct += (logits.argmax(1) == y).sum().item()
            seen += y.numel()
            if it % cfg["log_every"] == 0:
                print(f"epoch {epoch} iter {it:4d} loss {loss.item():.4f}")
            it += 1
        print(f"epoch {epoch} done, train acc {correct / seen:.3f}")


if __name__ == "__main__":
    train(CFG)
