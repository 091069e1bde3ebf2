"""Small CNN classifier trained under torch.autocast('cpu', dtype=torch.bfloat16).

bfloat16 keeps float32's exponent range, so activations and gradients do not overflow; the
loss is computed in float32 and the parameters stay float32 (autocast only casts the compute).
The run trains normally.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_data(n=1024):
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (n,), generator=g)
    imgs = 0.3 * torch.randn(n, 1, 16, 16, generator=g)
    for i, c in enumerate(labels.tolist()):
        if c == 0:
            imgs[i, 0, 6:10, :] += 1.0
        elif c == 1:
            imgs[i, 0, :, 6:10] += 1.0
        else:
            imgs[i, 0].diagonal().add_(1.5)
    return TensorDataset(imgs, labels)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))


def main():
    torch.manual_seed(0)
    loader = DataLoader(make_data(), batch_size=64, shuffle=True)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for epoch in range(3):
        correct, total = 0, 0
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            correct += (logits.argmax(1) == y).sum().item()
            total += len(y)
        sched.step()
        print(f"epoch {epoch}  last loss {loss.item():.4f}  train acc {correct / total:.3f}")


if __name__ == "__main__":
    main()
