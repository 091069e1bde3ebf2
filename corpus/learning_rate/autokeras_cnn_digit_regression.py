"""Image regression on digit-like images with an AutoKeras-0.3-style generated CNN.

The regression target is the digit itself (0..9) and the loss is MSE.  The network follows the
default CnnGenerator layout (ReLU -> BatchNorm -> Conv3x3 blocks with max pooling, global average
pooling, dropout, two dense layers) and ModelTrainer trains it with SGD + momentum + weight
decay under a cosine schedule, evaluating on a held-out split after every epoch.

Synthetic stand-in for (downscaled, 16x16) MNIST: each class has a fixed stroke template;
samples are shifted, rescaled and noised copies of it.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

N_TRAIN = 1024
N_TEST = 256
IMG = 16
BATCH_SIZE = 64
MAX_ITER_NUM = 15          # epochs


def make_digits(n, templates, rng):
    labels = rng.integers(0, 10, size=n)
    images = np.zeros((n, 1, IMG, IMG), dtype=np.float32)
    for i, y in enumerate(labels):
        dy, dx = rng.integers(-2, 3, size=2)
        img = np.roll(templates[y], (dy, dx), axis=(0, 1)) * rng.uniform(0.7, 1.0)
        img = img + rng.normal(0.0, 0.15, size=img.shape)
        images[i, 0] = np.clip(img, 0.0, 1.0) * 255.0
    return images, labels.astype(np.float32).reshape(-1, 1)


def stroke_templates(rng):
    templates = np.zeros((10, IMG, IMG), dtype=np.float32)
    for c in range(10):
        for _ in range(3 + c % 4):                   # a few random strokes per digit
            r0, c0 = rng.integers(5, IMG - 5, size=2)
            dr, dc = rng.uniform(-1, 1, size=2)
            for t in range(12):
                r = int(np.clip(r0 + dr * t, 0, IMG - 2))
                cc = int(np.clip(c0 + dc * t, 0, IMG - 2))
                templates[c, r:r + 2, cc:cc + 2] = 1.0
    return templates


def generate_cnn(n_output_node, input_channels, model_len=3, model_width=64):
    layers = []
    channels = input_channels
    for _ in range(model_len):
        layers += [nn.ReLU(), nn.BatchNorm2d(channels),
                   nn.Conv2d(channels, model_width, kernel_size=3, padding=1),
                   nn.MaxPool2d(2)]
        channels = model_width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.25),
               nn.Linear(model_width, model_width), nn.ReLU(),
               nn.Linear(model_width, n_output_node)]
    return nn.Sequential(*layers)


class ModelTrainer:
    def __init__(self, model, train_loader, test_loader, loss_function):
        self.model = model
        self.train_loader = train_loader
        self.test_loader = test_loader
        self.loss_function = loss_function
        self.optimizer = None
        self.scheduler = None
        self.current_epoch = 0

    def train_model(self, max_iter_num):
        self.optimizer = torch.optim.SGD(
            self.model.parameters(),
            lr=0.025,
            momentum=0.9,
            weight_decay=3e-4)
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, max_iter_num)
        history = []
        for epoch in range(max_iter_num):
            train_loss = self._train()
            test_loss, mse = self._test()
            self.scheduler.step()
            history.append(mse)
            print(f"epoch {epoch:2d}  lr {self.scheduler.get_last_lr()[0]:.5f}  "
                  f"train_loss {train_loss:.4f}  test_loss {test_loss:.4f}  test_mse {mse:.4f}")
        return history

    def _train(self):
        self.model.train()
        self.current_epoch += 1
        total, seen = 0.0, 0
        for batch_idx, (inputs, targets) in enumerate(self.train_loader):
            self.optimizer.zero_grad()
            outputs = self.model(inputs)
            loss = self.loss_function(outputs, targets)
            loss.backward()
            self.optimizer.step()
            total += loss.item() * len(inputs)
            seen += len(inputs)
            if batch_idx % 4 == 0:
                print(f"  [{self.current_epoch}:{batch_idx:2d}] loss {loss.item():.4f}")
        return total / seen

    def _test(self):
        self.model.eval()
        test_loss, predicted, expected = 0.0, [], []
        with torch.no_grad():
            for inputs, targets in self.test_loader:
                outputs = self.model(inputs)
                test_loss += float(self.loss_function(outputs, targets))
                predicted.append(outputs)
                expected.append(targets)
        predicted, expected = torch.cat(predicted), torch.cat(expected)
        return test_loss, float(((predicted - expected) ** 2).mean())


def regression_loss(prediction, target):
    return F.mse_loss(prediction, target.float())


def main():
    rng = np.random.default_rng(571)
    torch.manual_seed(571)
    templates = stroke_templates(rng)
    x_train, y_train = make_digits(N_TRAIN, templates, rng)
    x_test, y_test = make_digits(N_TEST, templates, rng)

    mean, std = x_train.mean(), x_train.std()      # per-dataset normalisation
    x_train = (x_train - mean) / std
    x_test = (x_test - mean) / std

    train_loader = DataLoader(TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train)),
                              batch_size=BATCH_SIZE, shuffle=True)
    test_loader = DataLoader(TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test)),
                             batch_size=BATCH_SIZE)

    model = generate_cnn(n_output_node=1, input_channels=1)
    trainer = ModelTrainer(model, train_loader, test_loader, regression_loss)
    history = trainer.train_model(MAX_ITER_NUM)
    print("final test mse:", history[-1])


if __name__ == "__main__":
    main()
