"""CIFAR-style ResNet-ish classifier trained with SGDW (decoupled weight decay,
Loshchilov & Hutter), including the paper's normalized weight decay and an
optional cosine-annealing multiplier. Synthetic 16x16 images, 10 classes."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import Optimizer
from torch.utils.data import DataLoader, TensorDataset

CONFIG = {
    "lr": 0.05,
    "momentum": 0.9,
    "nesterov": True,
    "weight_decay": 0.025,  # normalized lambda from the paper's grid
    "batch_size": 32,
    "epochs": 3,
    "use_cosine_annealing": False,
    "seed": 0,
}


class SGDW(Optimizer):
    def __init__(self, params, lr=0.01, momentum=0.0, nesterov=False, weight_decay=0.0,
                 batch_size=32, total_iterations=0, use_cosine_annealing=False, eta_min=0.0, eta_max=1.0):
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                        batch_size=batch_size, total_iterations=total_iterations,
                        use_cosine_annealing=use_cosine_annealing, eta_min=eta_min, eta_max=eta_max)
        super().__init__(params, defaults)
        self.t_cur = 0

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            total = torch.tensor(float(group["total_iterations"]))
            eta_t = torch.tensor(1.0)
            if group["use_cosine_annealing"] and group["total_iterations"] != 0:
                eta_t = group["eta_min"] + 0.5 * (group["eta_max"] - group["eta_min"]) * (
                    1 + torch.cos(torch.pi * self.t_cur / total))
            wd_norm = group["weight_decay"] * torch.sqrt(group["batch_size"] / total)
            for p in group["params"]:
                if p.grad is None:
                    continue
                d_p = p.grad
                state = self.state[p]
                if group["momentum"] != 0:
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = d_p.clone()
                    else:
                        buf.mul_(group["momentum"]).add_(d_p)
                    d_p = d_p.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf
                p.sub_(eta_t * (group["lr"] * d_p + wd_norm * p))
        self.t_cur += 1
        return loss


class Block(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.short = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.short = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.short(x))


class TinyResNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = Block(16, 16, 1)
        self.layer2 = Block(16, 32, 2)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def make_data(n=960, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    protos = torch.randn(10, 3, 16, 16, generator=g)
    x = protos[y] + 0.8 * torch.randn(n, 3, 16, 16, generator=g)
    return TensorDataset(x, y)


def main(cfg=CONFIG):
    torch.manual_seed(cfg["seed"])
    loader = DataLoader(make_data(seed=cfg["seed"]), batch_size=cfg["batch_size"], shuffle=True)
    model = TinyResNet()
    optimizer = SGDW(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"], nesterov=cfg["nesterov"],
                     weight_decay=cfg["weight_decay"], batch_size=cfg["batch_size"],
                     use_cosine_annealing=cfg["use_cosine_annealing"])
    step = 0
    for epoch in range(cfg["epochs"]):
        correct = 0
        for x, y in loader:
            out = model(x)
            loss = F.cross_entropy(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct += (out.argmax(1) == y).sum().item()
            step += 1
            if step % 5 == 0 or step < 5:
                print(f"epoch {epoch} iter {step} loss {loss.item():.4f}")
        print(f"epoch {epoch} train acc {correct / len(loader.dataset):.3f}")


if __name__ == "__main__":
    main()
