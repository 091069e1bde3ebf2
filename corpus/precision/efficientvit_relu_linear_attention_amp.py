"""Tiny EfficientViT-style classifier (MBConv stem + multi-scale ReLU linear attention)
trained with mixed precision on synthetic texture images."""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class TextureDataset(Dataset):
    """Four classes of oriented stripe / blob textures with noise."""

    def __init__(self, n, size=32, seed=0):
        g = torch.Generator().manual_seed(seed)
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
        self.images, self.labels = [], []
        for i in range(n):
            c = i % 4
            freq = 3 + 4 * torch.rand(1, generator=g).item()
            phase = 6.28 * torch.rand(1, generator=g).item()
            if c == 0:
                base = torch.sin(freq * xs * 3.14 + phase)
            elif c == 1:
                base = torch.sin(freq * ys * 3.14 + phase)
            elif c == 2:
                base = torch.sin(freq * (xs + ys) * 2.2 + phase)
            else:
                base = torch.cos(freq * torch.sqrt(xs ** 2 + ys ** 2) * 3.14 + phase)
            img = base.expand(3, size, size) * torch.rand(3, 1, 1, generator=g)
            img = img + 0.3 * torch.randn(3, size, size, generator=g)
            self.images.append(img)
            self.labels.append(c)
        self.images = torch.stack(self.images)
        self.labels = torch.tensor(self.labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, idx):
        return self.images[idx], self.labels[idx]


class ConvBNAct(nn.Sequential):
    def __init__(self, cin, cout, k=3, stride=1, groups=1, act=True):
        super().__init__(
            nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            nn.Hardswish() if act else nn.Identity(),
        )


class MBConv(nn.Module):
    def __init__(self, cin, cout, stride=1, expand=4):
        super().__init__()
        mid = cin * expand
        self.block = nn.Sequential(
            ConvBNAct(cin, mid, 1),
            ConvBNAct(mid, mid, 3, stride, groups=mid),
            ConvBNAct(mid, cout, 1, act=False),
        )
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        out = self.block(x)
        return x + out if self.residual else out


class LiteMLA(nn.Module):
    """Multi-scale linear attention with a ReLU kernel."""

    def __init__(self, channels, dim=8, scales=(5,), eps=1.0e-15):
        super().__init__()
        self.dim = dim
        self.eps = eps
        heads = channels // dim
        total = heads * dim
        self.qkv = nn.Conv2d(channels, 3 * total, 1, bias=False)
        self.aggreg = nn.ModuleList([
            nn.Sequential(
                nn.Conv2d(3 * total, 3 * total, s, padding=s // 2, groups=3 * total, bias=False),
                nn.Conv2d(3 * total, 3 * total, 1, groups=3 * heads, bias=False),
            )
            for s in scales
        ])
        self.proj = ConvBNAct(total * (1 + len(scales)), channels, 1, act=False)

    def relu_linear_att(self, qkv):
        B, _, H, W = qkv.shape
        qkv = qkv.reshape(B, -1, 3 * self.dim, H * W).transpose(-1, -2)
        q, k, v = qkv[..., :self.dim], qkv[..., self.dim:2 * self.dim], qkv[..., 2 * self.dim:]
        q = F.relu(q)
        k = F.relu(k)
        v = F.pad(v, (0, 1), mode="constant", value=1)
        kv = torch.matmul(k.transpose(-1, -2), v)
        out = torch.matmul(q, kv)
        out = out[..., :-1] / (out[..., -1:] + self.eps)
        return out.transpose(-1, -2).reshape(B, -1, H, W)

    def forward(self, x):
        qkv = self.qkv(x)
        multi = [qkv] + [op(qkv) for op in self.aggreg]
        qkv = torch.cat(multi, dim=1)
        return self.proj(self.relu_linear_att(qkv))


class EfficientViTBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.context = LiteMLA(channels)
        self.local = MBConv(channels, channels)

    def forward(self, x):
        x = x + self.context(x)
        return self.local(x)


class TinyEfficientViT(nn.Module):
    def __init__(self, num_classes=4, width=32):
        super().__init__()
        self.stem = nn.Sequential(ConvBNAct(3, 16, 3, 2), MBConv(16, 16))
        self.stage1 = MBConv(16, width, stride=2)
        self.stage2 = nn.Sequential(EfficientViTBlock(width), EfficientViTBlock(width))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes))

    def forward(self, x):
        return self.head(self.stage2(self.stage1(self.stem(x))))


def train_one_epoch(model, loader, optimizer, scaler, epoch, args):
    model.train()
    for step, (images, labels) in enumerate(loader):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16, enabled=args.amp):
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if step % args.log_every == 0:
            acc = (logits.argmax(1) == labels).float().mean().item()
            print(f"epoch {epoch} step {step:3d} loss {loss.item():.4f} acc {acc:.3f} scale {scaler.get_scale():.0f}")


@torch.no_grad()
def evaluate(model, loader, args):
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    for images, labels in loader:
        with torch.autocast("cpu", dtype=torch.float16, enabled=args.amp):
            logits = model(images)
        loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum").item()
        correct += (logits.argmax(1) == labels).sum().item()
        total += labels.numel()
    return loss_sum / total, correct / total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--no-amp", dest="amp", action="store_false")
    args = parser.parse_args()

    torch.manual_seed(0)
    train_loader = DataLoader(TextureDataset(384, seed=1), batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(TextureDataset(64, seed=2), batch_size=64)

    model = TinyEfficientViT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    scaler = torch.amp.GradScaler("cpu", enabled=args.amp)

    start = time.time()
    for epoch in range(args.epochs):
        train_one_epoch(model, train_loader, optimizer, scaler, epoch, args)
        val_loss, val_acc = evaluate(model, val_loader, args)
        print(f"epoch {epoch} val_loss {val_loss:.4f} val_acc {val_acc:.3f} ({time.time() - start:.1f}s)")


if __name__ == "__main__":
    main()
