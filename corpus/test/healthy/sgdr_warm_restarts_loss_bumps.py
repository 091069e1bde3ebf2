"""Small CNN on synthetic 3-class textures with SGDR (CosineAnnealingWarmRestarts).

The learning rate is reset to its peak at every restart (after 60, 180 and 420
iterations), so the training loss jumps up for a while after each restart before
settling lower than before -- the expected SGDR saw-tooth.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import CosineAnnealingWarmRestarts
from torch.utils.data import DataLoader, TensorDataset


def make_textures(n=1536, size=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    labels = torch.randint(0, 3, (n,), generator=g)
    imgs = []
    for c in labels.tolist():
        f = 0.5 + float(torch.rand(1, generator=g))
        ph = 6.28 * float(torch.rand(1, generator=g))
        pattern = [torch.sin(f * xx + ph), torch.sin(f * yy + ph), torch.sin(f * (xx + yy) / 1.4 + ph)][c]
        imgs.append(pattern + 3.0 * torch.randn(size, size, generator=g))
    return torch.stack(imgs).unsqueeze(1), labels


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn1, self.bn2 = nn.BatchNorm2d(16), nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.mean(dim=(2, 3)))


def main():
    torch.manual_seed(0)
    x, y = make_textures()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.4, momentum=0.9, weight_decay=5e-4)
    sched = CosineAnnealingWarmRestarts(opt, T_0=60, T_mult=2, eta_min=1e-4)
    step, window = 0, []
    while step < 660:
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            window.append(loss.item())
            if step % 10 == 0:
                lr = opt.param_groups[0]["lr"]
                print(f"iter {step:4d} lr {lr:.4f} loss {loss.item():.4f} avg10 {sum(window[-10:]) / len(window[-10:]):.4f}")
            step += 1
            if step >= 660:
                break


if __name__ == "__main__":
    main()
