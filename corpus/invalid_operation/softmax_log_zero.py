"""Softmax regression with the cross-entropy written out as -sum(y * log(pred)).

Reported in aymericdamien/TensorFlow-Examples#383 ("[Potential NAN bug] Loss may become NAN
during training", https://github.com/aymericdamien/TensorFlow-Examples/issues/383): the
logistic-regression example computes ``cost = mean(-sum(y * log(pred)))`` with pred the
softmax output.  On the reporter's data the loss became NaN after some iterations: "If pred
contains 0 (output of softmax), the result of log(pred) is inf", and 0 * -inf = NaN for the
classes whose one-hot label is 0.  Fix proposed (PR #384): ``log(pred + 1e-10)`` or clip pred
to [1e-10, 1]; better, use log_softmax / F.cross_entropy on the logits.

On the synthetic 8x8 grey-level images (pixel values 0..255, like the reporter's own data)
the first updates make the logits of some samples very confident: once the gap between two
logits exceeds ~104 the float32 softmax underflows to exactly 0 for a class, log(0) = -inf,
0 * -inf = NaN, and the first epoch's cost prints as nan.  With the same learning rate the
log_softmax formulation trains to a cost of ~1e-5.
"""
import numpy as np
import torch

rng = np.random.default_rng(0)
torch.manual_seed(0)

n_features, n_classes = 64, 10
centers = rng.uniform(0, 255, (n_classes, n_features))           # 8x8 grey-level "digits"
labels = rng.integers(0, n_classes, 5000)
images = np.clip(centers[labels] + rng.normal(0, 40, (5000, n_features)), 0, 255).round()
X = torch.tensor(images, dtype=torch.float32)
Y = torch.nn.functional.one_hot(torch.tensor(labels), n_classes).float()

W = torch.zeros(n_features, n_classes, requires_grad=True)
b = torch.zeros(n_classes, requires_grad=True)
learning_rate = 1e-4
batch_size = 100

for epoch in range(25):
    avg_cost = 0.0
    total_batch = len(X) // batch_size
    for i in range(total_batch):
        xs = X[i * batch_size:(i + 1) * batch_size]
        ys = Y[i * batch_size:(i + 1) * batch_size]
        pred = torch.softmax(xs @ W + b, dim=1)
        cost = torch.mean(-torch.sum(ys * torch.log(pred), dim=1))
        cost.backward()
        with torch.no_grad():
            W -= learning_rate * W.grad
            b -= learning_rate * b.grad
            W.grad.zero_()
            b.grad.zero_()
        avg_cost += cost.item() / total_batch
    print(f"Epoch: {epoch + 1:04d} cost= {avg_cost:.9f}")
