"""A logistic regression written with bare tensors (no nn.Module), as in the TensorFlow-style
tutorials: cross-entropy as -sum(y * log(softmax)), where a saturated softmax gives log(0)."""

import torch

torch.manual_seed(0)
x = torch.randn(256, 20) * 8
labels = torch.randint(0, 5, (256,))
y = torch.nn.functional.one_hot(labels, 5).float()
W = torch.zeros(20, 5, requires_grad=True)
b = torch.zeros(5, requires_grad=True)
for step in range(50):
    pred = torch.softmax(x @ W + b, dim=1)
    cost = torch.mean(-torch.sum(y * torch.log(pred), dim=1))
    cost.backward()
    with torch.no_grad():
        W -= 1.0 * W.grad
        b -= 1.0 * b.grad
        W.grad.zero_()
        b.grad.zero_()
    print(f"step {step} cost {cost.item():.4f}")
