"""Healthy: a plain float32 CNN (no AMP, no bfloat16) on synthetic 3-channel 24x24 images with
a Dataset class, a shuffled DataLoader, StepLR, a torch.no_grad() evaluation loop and logging
to a file."""

import logging

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

logging.basicConfig(filename="cnn_train.log", filemode="w", level=logging.INFO)
logger = logging.getLogger(__name__)


class StripesDataset(Dataset):
    """Class k = stripes at orientation k (horizontal, vertical, two diagonals), plus noise."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (n,), generator=g)
        r = torch.arange(24).float()
        yy, xx = torch.meshgrid(r, r, indexing="ij")
        patterns = torch.stack([yy, xx, xx + yy, xx - yy]).div(2).sin()
        self.images = patterns[self.labels].unsqueeze(1).repeat(1, 3, 1, 1)
        self.images += 6.0 * torch.randn(self.images.shape, generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 6 * 6, 4)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def evaluate(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(dim=1) == labels).sum().item()
    return correct / len(loader.dataset)


torch.manual_seed(0)
train_loader = DataLoader(StripesDataset(640, 0), batch_size=32, shuffle=True)
test_loader = DataLoader(StripesDataset(160, 1), batch_size=80)
model = SmallCNN()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.3)
for epoch in range(3):
    model.train()
    for images, labels in train_loader:
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    scheduler.step()
    accuracy = evaluate(model, test_loader)
    logger.info("epoch %d loss %.4f accuracy %.3f", epoch, loss.item(), accuracy)
    print(f"epoch {epoch} loss {loss.item():.4f} test accuracy {accuracy:.3f}")
