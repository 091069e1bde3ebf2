"""RevNet (reversible residual network) image classifier, trained like train_cifar.py.

Bug: the additive couplings y1 = x1 + F(x2), y2 = x2 + G(y1) are built from residual
Blocks that add their own identity shortcut, and there is no normalisation before the
pooling, so the residual stream grows ~2.6x per reversible block and the gradients of
the cross-entropy explode (norm ~180 at step 0, 1.8e4 at step 1, 4e7 at step 2).  With
--clip left at its default 0 the SGD steps are unclipped: the loss goes 26, 4e4, 2.7e9,
4.8e19, 2.3e33 (gradient nan) and is nan from step 5; every later printed loss is nan.
Report: https://github.com/tbung/pytorch-revnet/issues/1 (revnet38 loss quickly goes to
NaN on CIFAR; maintainer: try adding "--clip 0.25" ... "the gradients of the revnet tend
to explode a bit"; reporter: "Adding clipping worked beautifully!").
Fix: clip the gradient norm (run with --clip 0.25): the same run trains, loss 26 -> ~1.5,
validation accuracy ~45-58% after 3 epochs.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="revnet20", help="what model to use")
parser.add_argument("--batch-size", default=64, type=int, help="size of the mini-batches")
parser.add_argument("--epochs", default=3, type=int, help="number of epochs")
parser.add_argument("--lr", default=0.1, type=float, help="initial learning rate")
parser.add_argument("--clip", default=0, type=float, help="maximal gradient norm")
parser.add_argument("--weight-decay", default=1e-4, type=float, help="weight decay factor")


def _possible_downsample(x, in_channels, out_channels):
    if in_channels < out_channels:
        pad = torch.zeros(x.size(0), (out_channels - in_channels) // 2, x.size(2), x.size(3))
        x = torch.cat([pad, x, pad], dim=1)
    return x


class Block(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1)

    def forward(self, x):
        out = self.conv1(F.relu(self.bn1(x)))
        out = self.conv2(F.relu(self.bn2(out)))
        return out + _possible_downsample(x, self.in_channels, self.out_channels)


class RevBlock(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.in_channels = in_channels // 2
        self.out_channels = out_channels // 2
        self.f = Block(self.in_channels, self.out_channels)
        self.g = Block(self.out_channels, self.out_channels)

    def forward(self, x):
        x1, x2 = torch.chunk(x, 2, dim=1)
        y1 = self.f(x2) + _possible_downsample(x1, self.in_channels, self.out_channels)
        y2 = self.g(y1) + _possible_downsample(x2, self.in_channels, self.out_channels)
        return torch.cat([y1, y2], dim=1)


class RevNet(nn.Module):
    def __init__(self, units, filters, classes):
        super().__init__()
        self.name = self.__class__.__name__
        self.layers = nn.ModuleList([nn.Conv2d(3, filters[0], 3, padding=1),
                                     nn.BatchNorm2d(filters[0])])
        self.groups = nn.ModuleList()
        for i, group_i in enumerate(units):
            group = nn.ModuleList([RevBlock(filters[i], filters[i + 1])])
            for _ in range(1, group_i):
                group.append(RevBlock(filters[i + 1], filters[i + 1]))
            self.groups.append(group)
        self.fc = nn.Linear(filters[-1], classes)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        for group in self.groups:
            for unit in group:
                x = unit(x)
        x = F.avg_pool2d(x, x.size(2))
        x = x.view(x.size(0), -1)
        return self.fc(x)


def revnet20():
    return RevNet(units=[2, 2, 2], filters=[16, 16, 32, 48], classes=10)


def tiny_cifar(n_train=1536, n_val=512, size=12, seed=0):
    """Ten smooth colour templates plus pixel noise, normalised per channel like CIFAR."""
    g = torch.Generator().manual_seed(seed)
    templates = F.avg_pool2d(torch.randn(10, 3, size, size, generator=g), 3, 1, 1)
    n = n_train + n_val
    labels = torch.randint(0, 10, (n,), generator=g)
    images = templates[labels] + 0.8 * torch.randn(n, 3, size, size, generator=g)
    mean = images.mean(dim=(0, 2, 3), keepdim=True)
    std = images.std(dim=(0, 2, 3), keepdim=True)
    images = (images - mean) / std
    train = TensorDataset(images[:n_train], labels[:n_train])
    val = TensorDataset(images[n_train:], labels[n_train:])
    return train, val


def train(epoch, model, criterion, optimizer, trainloader, clip):
    model.train()
    train_loss, correct, total = 0.0, 0, 0
    for i, (inputs, labels) in enumerate(trainloader):
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = criterion(outputs, labels)
        loss.backward()

        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()

        train_loss += loss.item()
        correct += (outputs.argmax(1) == labels).sum().item()
        total += labels.size(0)
        if i % 5 == 0:
            print("{:03d} [{:2d}/{}] loss {:.4g} (avg {:.4g}) acc {:.1f}%".format(
                epoch, i, len(trainloader), loss.item(), train_loss / (i + 1),
                100.0 * correct / total))
    return train_loss, 100.0 * correct / total


@torch.no_grad()
def validate(model, valloader):
    model.eval()
    correct, total = 0, 0
    for images, labels in valloader:
        correct += (model(images).argmax(1) == labels).sum().item()
        total += labels.size(0)
    return 100.0 * correct / total


def main():
    args = parser.parse_args()
    torch.manual_seed(0)
    model = globals()[args.model]()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9,
                                weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[50, 100, 150],
                                                     gamma=0.1)
    print("Prepairing data...")
    trainset, valset = tiny_cifar()
    trainloader = DataLoader(trainset, batch_size=args.batch_size, shuffle=True)
    valloader = DataLoader(valset, batch_size=256)

    print("\nTraining model...")
    start = time.time()
    for epoch in range(args.epochs):
        loss, train_acc = train(epoch, model, criterion, optimizer, trainloader, args.clip)
        scheduler.step()
        val_acc = validate(model, valloader)
        print("epoch {} train loss {:.4g} train acc {:.1f}% | Accuracy: {:.1f}%".format(
            epoch, loss / len(trainloader), train_acc, val_acc))
    print("done in {:.1f}s".format(time.time() - start))


if __name__ == "__main__":
    main()
