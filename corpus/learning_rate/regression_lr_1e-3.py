"""Linear price regression whose loss goes from thousands to trillions to nan.

Question on Data Science Stack Exchange ("Why is learning rate causing my neural network's
weights to skyrocket?", https://datascience.stackexchange.com/questions/15962): plain gradient
descent with a learning rate of .001, which the author "thought was pretty conservative", made
the loss explode ("from a number in the thousands to a trillion and then to infinity ('nan')");
"When I lowered the learning rate to .0001, everything worked fine."  The answer explains it as
an ill-conditioned problem where a too-large step size diverges.

Fix: lower the learning rate to 1e-4.
"""
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

LEARNING_RATE = 1e-3
EPOCHS = 20


def build_data(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    rooms = rng.integers(1, 8, n)
    area = rng.uniform(30.0, 90.0, n)           # square metres
    age = rng.uniform(0.0, 40.0, n)             # years
    x = np.stack([rooms, area, age], axis=1).astype(np.float32)
    y = (15 * rooms + 2.5 * area - 1.2 * age + rng.normal(0, 5, n)).astype(np.float32)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y).unsqueeze(1))


def build_model():
    return nn.Linear(3, 1)          # price ~ w . features + b


def train():
    torch.manual_seed(0)
    loader = DataLoader(build_data(), batch_size=50, shuffle=True)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    loss_fn = nn.MSELoss()
    for epoch in range(EPOCHS):
        total = 0.0
        for x, y in loader:
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        print(f"epoch {epoch + 1}: loss {total / len(loader):.2f}")


if __name__ == "__main__":
    train()
