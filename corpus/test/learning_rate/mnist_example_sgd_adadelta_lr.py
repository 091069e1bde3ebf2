"""MNIST example switched from Adadelta to plain SGD, keeping the Adadelta learning rate.

Reproduces https://github.com/pytorch/examples/issues/736 ("MNIST Optimizer"):
the pytorch/examples mnist/main.py trains with optim.Adadelta(lr=1.0).  The
reporter replaced the optimizer by optim.SGD and kept everything else, and
every printed loss became nan.  Maintainers' answer: "If you want to switch to
SGD then you should also use a lower learning rate" (soumith: "what
@bentrevett said").

Here the digits are synthetic (stroke templates + jitter + noise, written to an
.npz file and read back like a cached dataset).  With SGD at the Adadelta
default --lr 1.0 the first few updates already overshoot, the logits are
thrown out of range within ten iterations and the loss goes nan.

Fix: pass a learning rate suited to SGD (e.g. --lr 0.01).
"""
import argparse
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, Dataset


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def make_fake_mnist(path, n_train=2400, n_test=400, seed=0):
    """Write a small MNIST-like npz: 10 stroke templates, shifted, scaled, noisy."""
    rng = np.random.RandomState(seed)
    templates = np.zeros((10, 28, 28), dtype=np.float32)
    for c in range(10):
        n_strokes = 3 + c % 3
        for _ in range(n_strokes):
            r0, c0 = rng.randint(6, 22, size=2)
            r1, c1 = rng.randint(6, 22, size=2)
            for t in np.linspace(0.0, 1.0, 40):
                r = int(round(r0 + t * (r1 - r0)))
                cc = int(round(c0 + t * (c1 - c0)))
                templates[c, max(r - 2, 0):r + 3, max(cc - 2, 0):cc + 3] = 255.0

    def sample(n):
        y = rng.randint(0, 10, size=n)
        x = np.zeros((n, 28, 28), dtype=np.uint8)
        for i in range(n):
            img = np.roll(templates[y[i]], rng.randint(-3, 4), axis=0)
            img = np.roll(img, rng.randint(-3, 4), axis=1)
            img = img * rng.uniform(0.6, 1.0) + rng.normal(0, 10, size=(28, 28))
            x[i] = np.clip(img, 0, 255).astype(np.uint8)
        return x, y

    x_train, y_train = sample(n_train)
    x_test, y_test = sample(n_test)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


class NpzMNIST(Dataset):
    def __init__(self, path, train=True):
        data = np.load(path)
        split = "train" if train else "test"
        self.images = data["x_" + split]
        self.labels = data["y_" + split]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        img = torch.from_numpy(self.images[idx]).float().div(255.0).unsqueeze(0)
        img = (img - 0.1307) / 0.3081  # same Normalize((0.1307,), (0.3081,)) as the example
        return img, int(self.labels[idx])


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(
        test_loss, correct, len(test_loader.dataset),
        100. * correct / len(test_loader.dataset)))


def main():
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=64, metavar='N',
                        help='input batch size for training (default: 64)')
    parser.add_argument('--test-batch-size', type=int, default=500, metavar='N',
                        help='input batch size for testing (default: 500)')
    parser.add_argument('--epochs', type=int, default=2, metavar='N',
                        help='number of epochs to train (default: 2)')
    parser.add_argument('--lr', type=float, default=1.0, metavar='LR',
                        help='learning rate (default: 1.0)')
    parser.add_argument('--gamma', type=float, default=0.7, metavar='M',
                        help='Learning rate step gamma (default: 0.7)')
    parser.add_argument('--seed', type=int, default=1, metavar='S',
                        help='random seed (default: 1)')
    parser.add_argument('--log-interval', type=int, default=5, metavar='N',
                        help='how many batches to wait before logging training status')
    parser.add_argument('--data', type=str, default=None,
                        help='path to the cached mnist npz (generated if missing)')
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    data_path = args.data or os.path.join(tempfile.gettempdir(), "fake_mnist_examples736.npz")
    if not os.path.exists(data_path):
        make_fake_mnist(data_path)

    train_loader = DataLoader(NpzMNIST(data_path, train=True),
                              batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(NpzMNIST(data_path, train=False),
                             batch_size=args.test_batch_size, shuffle=False)

    model = Net().to(device)
    optimizer = optim.SGD(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()


if __name__ == '__main__':
    main()
