"""A 60-layer MLP whose Linear weights are re-initialised with nn.init.normal_ (std = 1).

Worked example from the "deepshare" PyTorch course notes on vanishing/exploding gradients
(https://blog.csdn.net/qq_24739717/article/details/102896678): an MLP of 256-unit Linear
layers initialised with ``nn.init.normal_(m.weight.data)`` has the std of its activations
multiplied by about sqrt(256) = 16 per layer, so after ~30 layers the forward pass overflows
float32 and prints "output is nan in 31 layers".  The notes fix it with Xavier / Kaiming
initialisation (std = sqrt(1/n) or sqrt(2/n)), which keeps the activation scale constant.

Here the same initialisation sits in a classifier; the very first forward pass gives inf
logits and the loss is nan from step 0.  Fix: nn.init.kaiming_normal_(m.weight,
nonlinearity="relu") (or simply keep PyTorch's default init).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, neural_num, layers, n_classes=10):
        super().__init__()
        self.linears = nn.ModuleList([nn.Linear(neural_num, neural_num, bias=False) for _ in range(layers)])
        self.out = nn.Linear(neural_num, n_classes)

    def forward(self, x):
        for linear in self.linears:
            x = torch.relu(linear(x))
        return self.out(x)

    def initialize(self):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight.data)


def main():
    torch.manual_seed(1)
    x = torch.randn(512, 256)
    y = (x[:, :10].argmax(dim=1))
    net = MLP(256, 60)
    net.initialize()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    for step in range(30):
        idx = torch.randint(0, 512, (64,))
        logits = net(x[idx])
        loss = F.cross_entropy(logits, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}  logit std {logits.std().item():.3e}")


if __name__ == "__main__":
    main()
