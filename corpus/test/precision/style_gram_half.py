"""Neural style transfer run in half precision: the Gram matrices overflow float16.

Reported in ProGamerGov/neural-style-pt#97 ("HalfTensor (float16) support? tried to implement
but failed", https://github.com/ProGamerGov/neural-style-pt/issues/97): after ``cnn.half()``
and switching the tensors to HalfTensor, every content/style loss printed nan.  The answer in
the thread: "something exceeds the maximal value of float16, which is a fairly small number
65500 ... the Gram Matrix is approximately the sum of the feature^2, which easily gets very
large"; suggested fixes are a fixed scaling of the features before the Gram matrix (or
keeping that part in float32).

Here a small random conv stack stands in for VGG.  The Gram entries of both style layers are
sums over 24x24 positions of products of ReLU features and exceed 65504 -> inf; inf - inf in
the style loss gives nan from the first iteration.  In float32 the same run converges.
Fix: ``F = F.float()`` (or divide the features by sqrt(h*w)) before ``torch.mm(F, F.t())``.
"""
import torch
import torch.nn as nn

torch.manual_seed(0)
dtype = torch.float16


class GramMatrix(nn.Module):
    def forward(self, x):
        b, c, h, w = x.size()
        f = x.view(c, h * w)
        return torch.mm(f, f.t())


class StyleLoss(nn.Module):
    def __init__(self, strength):
        super().__init__()
        self.gram = GramMatrix()
        self.strength = strength
        self.target = None
        self.mode = "none"
        self.loss = 0

    def forward(self, x):
        g = self.gram(x) / x.nelement()
        if self.mode == "capture":
            self.target = g.detach()
        elif self.mode == "loss":
            self.loss = self.strength * nn.functional.mse_loss(g, self.target)
        return x


def build_net():
    layers = [nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU()]
    style_losses = []
    net = nn.Sequential()
    for i, layer in enumerate(layers):
        net.add_module(str(i), layer)
        if isinstance(layer, nn.ReLU):
            sl = StyleLoss(1e3)
            net.add_module(f"style{i}", sl)
            style_losses.append(sl)
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.normal_(m.weight, 0, 0.5)
    return net, style_losses


net, style_losses = build_net()
net = net.to(dtype)
for p in net.parameters():
    p.requires_grad_(False)

style_image = (torch.rand(1, 3, 24, 24) * 255).to(dtype)          # caffe-style 0..255 input
for sl in style_losses:
    sl.mode = "capture"
net(style_image)
for sl in style_losses:
    sl.mode = "loss"

img = (torch.rand(1, 3, 24, 24) * 255).to(dtype).requires_grad_(True)
optimizer = torch.optim.SGD([img], lr=3e-6)
for i in range(1, 21):
    optimizer.zero_grad()
    net(img)
    loss = sum(sl.loss for sl in style_losses)
    loss.backward()
    optimizer.step()
    if i % 5 == 0 or i == 1:
        print(f"Iteration {i} / 20")
        for k, sl in enumerate(style_losses):
            print(f"  Style {k + 1} loss: {sl.loss.item()}")
        print(f"  Total loss: {loss.item()}")
