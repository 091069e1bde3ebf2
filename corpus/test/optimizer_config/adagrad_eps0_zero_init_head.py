"""Small sklearn-style MLP regressor trained with plain AdaGrad (eps=0) and a zero-initialised head.

Reproduces https://github.com/lisa-lab/pylearn2/issues/1496 ("AdaGrad rule yields NaN on first
iteration", hit while wrapping pylearn2 for scikit-neuralnetwork): with all-zero weights some
gradients are exactly zero on the first update, AdaGrad's accumulated sum of squared gradients is
still 0, and the update g / sqrt(sum g^2) is 0 / 0 = NaN.

Here the output layer starts at zero ("predict the mean of the standardised target"), so on the first
step every hidden weight and bias gets a gradient of exactly 0.  Adagrad with eps=0 and
initial_accumulator_value=0 divides 0 by 0, the hidden layers become NaN after one step and every
loss printed afterwards is nan.

Fix (pylearn2 #1499 / PR #1521): put a floor under the denominator -- AdaGrad(max_scaling=1e5), i.e.
an epsilon of 1e-5; in PyTorch keep a non-zero eps (Adagrad(..., eps=1e-5), or the default 1e-10).
"""
import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)
np.random.seed(0)


def make_dataset(n=2000):
    """Synthetic 'concrete strength' table: 8 mix/age features -> compressive strength (MPa)."""
    rng = np.random.RandomState(42)
    cement = rng.uniform(100, 540, n)
    slag = rng.uniform(0, 360, n) * (rng.rand(n) < 0.6)
    ash = rng.uniform(0, 200, n) * (rng.rand(n) < 0.5)
    water = rng.uniform(120, 250, n)
    plasticizer = rng.uniform(0, 30, n) * (rng.rand(n) < 0.7)
    coarse = rng.uniform(800, 1150, n)
    fine = rng.uniform(590, 990, n)
    age = rng.choice([3, 7, 14, 28, 56, 90, 180, 365], n)
    X = np.stack([cement, slag, ash, water, plasticizer, coarse, fine, age], 1)
    binder = cement + 0.6 * slag + 0.4 * ash
    y = 25 * binder / water * np.log1p(age) / np.log1p(28) - 10 + 0.15 * plasticizer
    y = y + rng.normal(0, 3.0, n)
    return X.astype(np.float32), y.astype(np.float32)


class MLPRegressor:
    def __init__(self, hidden=(64, 32), learning_rate=0.05, n_epochs=30, batch_size=64):
        self.hidden = hidden
        self.learning_rate = learning_rate
        self.n_epochs = n_epochs
        self.batch_size = batch_size

    def _build(self, n_in):
        layers, prev = [], n_in
        for h in self.hidden:
            layers += [nn.Linear(prev, h), nn.Tanh()]
            prev = h
        head = nn.Linear(prev, 1)
        # start from the mean of the (standardised) target
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        return nn.Sequential(*layers, head)

    def fit(self, X, y):
        self.x_mean, self.x_std = X.mean(0), X.std(0)
        self.y_mean, self.y_std = y.mean(), y.std()
        Xt = torch.from_numpy((X - self.x_mean) / self.x_std)
        yt = torch.from_numpy((y - self.y_mean) / self.y_std).unsqueeze(1)

        self.model = self._build(X.shape[1])
        optimizer = torch.optim.Adagrad(self.model.parameters(), lr=self.learning_rate, initial_accumulator_value=0.0, eps=0.0)
        loss_fn = nn.MSELoss()

        n = len(Xt)
        for epoch in range(self.n_epochs):
            perm = torch.randperm(n)
            running = 0.0
            for it, start in enumerate(range(0, n, self.batch_size)):
                idx = perm[start:start + self.batch_size]
                pred = self.model(Xt[idx])
                loss = loss_fn(pred, yt[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                running += loss.item() * len(idx)
                if epoch == 0 and it < 5:
                    print(f"epoch 1 iter {it}  mse {loss.item():.4f}")
            print(f"epoch {epoch + 1:2d}/{self.n_epochs}  train mse {running / n:.4f}")
        return self

    def predict(self, X):
        with torch.no_grad():
            Xt = torch.from_numpy((X - self.x_mean) / self.x_std)
            return self.model(Xt).squeeze(1).numpy() * self.y_std + self.y_mean


if __name__ == "__main__":
    X, y = make_dataset()
    split = 1600
    reg = MLPRegressor().fit(X[:split], y[:split])
    rmse = np.sqrt(np.mean((reg.predict(X[split:]) - y[split:]) ** 2))
    print(f"test rmse {rmse:.2f} MPa")
