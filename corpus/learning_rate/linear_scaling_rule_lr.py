"""Heat-map regression trained with the "linear scaling rule" lr for a 48-GPU batch.

Reported in open-mmlab/mmdetection#1710 ("Why I follow the Linear Scaling Rule to adjust my
Lr, but my loss gets nan?", https://github.com/open-mmlab/mmdetection/issues/1710): the config
lr (0.02 for 16 images) was scaled linearly to the larger total batch, lr = 0.12, and the
losses went nan; 0.08 and 0.06 also went nan, lr = 0.04 trained.  Maintainer (ZwwWayne):
"This is because at this time the LR is too big."

Here the same rule gives lr = 0.02 * 96 / 16 = 0.12 for SGD + momentum on an MSE heat-map
loss; the updates overshoot, the loss oscillates with growing amplitude and overflows within a
few iterations (0.08 and 0.06 also blow up, later).  Passing --lr 0.04 trains normally.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def gaussian_heatmaps(centers, size=16, sigma=1.5):
    ys = torch.arange(size).view(1, size, 1).float()
    xs = torch.arange(size).view(1, 1, size).float()
    cy = centers[:, 0].view(-1, 1, 1)
    cx = centers[:, 1].view(-1, 1, 1)
    return torch.exp(-((ys - cy) ** 2 + (xs - cx) ** 2) / (2 * sigma ** 2)).unsqueeze(1)


def make_batch(n, gen):
    centers = torch.rand(n, 2, generator=gen) * 12 + 2
    target = gaussian_heatmaps(centers) * 10.0
    img = target.repeat(1, 3, 1, 1) + 0.5 * torch.randn(n, 3, 16, 16, generator=gen)
    return img, target


class HeatmapNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.head = nn.Conv2d(32, 1, 1)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return self.head(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=48)
    parser.add_argument("--imgs-per-gpu", type=int, default=2)
    parser.add_argument("--base-lr", type=float, default=0.02, help="lr for a total batch of 16")
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--iters", type=int, default=300)
    args = parser.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    total_batch = args.gpus * args.imgs_per_gpu
    lr = args.lr if args.lr is not None else args.base_lr * total_batch / 16
    model = HeatmapNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    print(f"total batch {total_batch}, lr {lr}")

    for it in range(args.iters):
        img, target = make_batch(total_batch, gen)
        loss = F.mse_loss(model(img), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if it % 10 == 0 or not torch.isfinite(loss):
            print(f"iter {it:4d}  loss_heatmap {loss.item():.5f}")
            if not torch.isfinite(loss):
                break


if __name__ == "__main__":
    main()
