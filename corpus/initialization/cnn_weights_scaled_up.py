"""Shape classification (squares vs. crosses vs. rings) with a small CNN, a DataLoader, a log
file and a no_grad validation loop.

After building the model the script multiplies every parameter by 50 ("bigger weights, bigger
gradients, faster start"). Every layer then amplifies its input tens of times more than it
should, the logits of the first batch are ~1e5 instead of ~1, and the first SGD updates
throw the weights so far that the loss overflows within five batches.
"""

import logging

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

logging.basicConfig(
    level=logging.INFO,
    format="%(asctime)s %(message)s",
    handlers=[logging.FileHandler("shapes.log"), logging.StreamHandler()],
)


def render_shapes(n, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (n,), generator=g)
    r = torch.arange(size).float() - size / 2 + 0.5
    yy, xx = torch.meshgrid(r, r, indexing="ij")
    square = ((xx.abs() < 5) & (yy.abs() < 5)).float()
    cross = ((xx.abs() < 1.5) | (yy.abs() < 1.5)).float()
    ring = ((xx**2 + yy**2).sqrt() - 5).abs().lt(1.5).float()
    images = torch.stack([square, cross, ring])[labels]
    images = images + 0.3 * torch.randn(n, size, size, generator=g)
    return images.unsqueeze(1), labels


torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(1, 16, 3, padding=1),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1),
    nn.ReLU(),
    nn.MaxPool2d(2),
    nn.Conv2d(32, 32, 3, padding=1),
    nn.ReLU(),
    nn.Flatten(),
    nn.Linear(32 * 4 * 4, 3),
)
with torch.no_grad():
    for p in model.parameters():
        p.data.mul_(50.0)

train_loader = DataLoader(TensorDataset(*render_shapes(960)), batch_size=32, shuffle=True)
val_x, val_y = render_shapes(200, seed=1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
criterion = nn.CrossEntropyLoss()
for epoch in range(2):
    model.train()
    for i, (images, labels) in enumerate(train_loader):
        loss = criterion(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i % 5 == 0:
            logging.info("epoch %d batch %d loss %.4g", epoch, i, loss.item())
    model.eval()
    with torch.no_grad():
        accuracy = (model(val_x).argmax(1) == val_y).float().mean().item()
    logging.info("epoch %d val accuracy %.3f", epoch, accuracy)
