"""Training a simple MLP on MNIST-like digits, ported from JAX's "neural network and data
loading" notebook to PyTorch (hand-written params, predict / loss / update functions,
NumpyLoader with numpy_collate and a FlattenAndCast transform).

Bug: the plain SGD update runs with step_size = 0.001.  The pixels go into the network as
raw 0..255 float32 values (FlattenAndCast only casts) and the loss is summed over the
128-image batch, so a step of 0.001 is far too large: the loss jumps from ~330 to ~1e19
within 10 updates, the logits overflow and the loss is nan from update 12 on (first
printed at step 20).
Report: https://github.com/jax-ml/jax/pull/159 ("Lower learning rate in NN example
notebook to fix divergence": step_size = 0.001 -> 0.0001).
Fix: step_size = 0.0001: the same run trains (loss ~330 -> ~0.2, test accuracy ~1.0).
"""
import time

import numpy as np
import torch
from torch.utils import data


def random_layer_params(m, n, scale=1e-2):
    w = scale * torch.randn(n, m)
    b = scale * torch.randn(n)
    return [w.requires_grad_(), b.requires_grad_()]


def init_network_params(sizes):
    return [random_layer_params(m, n) for m, n in zip(sizes[:-1], sizes[1:])]


layer_sizes = [784, 512, 512, 10]
step_size = 0.001
num_epochs = 4
batch_size = 128
n_targets = 10

torch.manual_seed(0)
params = init_network_params(layer_sizes)


def relu(x):
    return torch.clamp(x, min=0)


def predict(params, image):
    activations = image
    for w, b in params[:-1]:
        outputs = activations @ w.T + b
        activations = relu(outputs)
    final_w, final_b = params[-1]
    logits = activations @ final_w.T + final_b
    return logits - torch.logsumexp(logits, dim=1, keepdim=True)


def one_hot(x, k, dtype=np.float32):
    return np.array(x[:, None] == np.arange(k), dtype)


def accuracy(params, images, targets):
    target_class = np.argmax(targets, axis=1)
    with torch.no_grad():
        predicted_class = predict(params, torch.from_numpy(images)).argmax(1).numpy()
    return np.mean(predicted_class == target_class)


def loss(params, images, targets):
    preds = predict(params, images)
    return -torch.sum(preds * targets)


def update(params, x, y):
    l = loss(params, x, y)
    grads = torch.autograd.grad(l, [p for layer in params for p in layer])
    with torch.no_grad():
        i = 0
        for layer in params:
            for p in layer:
                p -= step_size * grads[i]
                i += 1
    return l.item()


# ----------------------------------------------------------------------------- data loading
def numpy_collate(batch):
    if isinstance(batch[0], np.ndarray):
        return np.stack(batch)
    elif isinstance(batch[0], (tuple, list)):
        transposed = zip(*batch)
        return [numpy_collate(samples) for samples in transposed]
    else:
        return np.array(batch)


class NumpyLoader(data.DataLoader):
    def __init__(self, dataset, batch_size=1, shuffle=False, drop_last=False):
        super().__init__(dataset, batch_size=batch_size, shuffle=shuffle,
                         collate_fn=numpy_collate, drop_last=drop_last)


class FlattenAndCast(object):
    def __call__(self, pic):
        return np.ravel(np.array(pic, dtype=np.float32))


class SyntheticMNIST(data.Dataset):
    """Stand-in for torchvision.datasets.MNIST: uint8 28x28 strokes, one template per digit."""

    def __init__(self, n, seed, transform=None):
        rng = np.random.RandomState(seed)
        tmpl_rng = np.random.RandomState(1234)
        templates = np.zeros((10, 28, 28), np.float32)
        for d in range(10):
            for _ in range(6):
                r0, c0 = tmpl_rng.randint(4, 18, size=2)
                if tmpl_rng.rand() < 0.5:
                    templates[d, r0:r0 + 3, c0:c0 + 10] = 1.0
                else:
                    templates[d, r0:r0 + 10, c0:c0 + 3] = 1.0
        self.labels = rng.randint(0, 10, size=n)
        imgs = templates[self.labels]
        shifts = rng.randint(-2, 3, size=(n, 2))
        for i in range(n):
            for _ in range(3):  # writer-specific extra strokes
                r0, c0 = rng.randint(4, 18, size=2)
                if rng.rand() < 0.5:
                    imgs[i, r0:r0 + 3, c0:c0 + 8] = 1.0
                else:
                    imgs[i, r0:r0 + 8, c0:c0 + 3] = 1.0
            imgs[i] = np.roll(imgs[i], tuple(shifts[i]), axis=(0, 1))
        imgs = imgs * rng.uniform(0.6, 1.0, size=(n, 1, 1)) + 0.05 * rng.rand(n, 28, 28)
        self.images = np.clip(imgs * 255, 0, 255).astype(np.uint8)
        self.transform = transform

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = self.images[i]
        if self.transform is not None:
            img = self.transform(img)
        return img, self.labels[i]


mnist_dataset = SyntheticMNIST(20000, seed=0, transform=FlattenAndCast())
training_generator = NumpyLoader(mnist_dataset, batch_size=batch_size)

train_images = np.array(mnist_dataset.images).reshape(len(mnist_dataset.images), -1).astype(np.float32)
train_labels = one_hot(np.array(mnist_dataset.labels), n_targets)
mnist_dataset_test = SyntheticMNIST(1000, seed=1)
test_images = np.array(mnist_dataset_test.images).reshape(len(mnist_dataset_test.images), -1).astype(np.float32)
test_labels = one_hot(np.array(mnist_dataset_test.labels), n_targets)

step = 0
for epoch in range(num_epochs):
    start_time = time.time()
    for x, y in training_generator:
        y = one_hot(y, n_targets)
        l = update(params, torch.from_numpy(x), torch.from_numpy(y))
        if step % 10 == 0:
            print("step {} loss {:.4f}".format(step, l))
        step += 1
    epoch_time = time.time() - start_time

    train_acc = accuracy(params, train_images, train_labels)
    test_acc = accuracy(params, test_images, test_labels)
    print("Epoch {} in {:0.2f} sec".format(epoch, epoch_time))
    print("Training set accuracy {}".format(train_acc))
    print("Test set accuracy {}".format(test_acc))
