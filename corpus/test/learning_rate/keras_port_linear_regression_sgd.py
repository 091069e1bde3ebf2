"""First steps: fit y = 0.5 * x with a single Dense unit.

A small port of the classic Keras "hello world" (Sequential([Dense(1)]), compile("sgd", "mse"),
fit(xs, ys, epochs=500)) to PyTorch, keeping Keras' defaults: glorot-uniform kernel, zero bias,
SGD with learning rate 0.01, mean squared error and a batch size of 32.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Dense(nn.Linear):
    """Keras-style Dense layer: glorot_uniform kernel, zeros bias."""

    def __init__(self, units, input_dim):
        super().__init__(input_dim, units)
        nn.init.xavier_uniform_(self.weight)
        nn.init.zeros_(self.bias)


class Sequential(nn.Sequential):
    """Just enough of the Keras Sequential API to run the tutorial."""

    def compile(self, optimizer="sgd", loss="mean_squared_error", learning_rate=0.01):
        if optimizer != "sgd":
            raise ValueError("only 'sgd' is supported here")
        self.optimizer = torch.optim.SGD(self.parameters(), lr=learning_rate)
        self.loss_fn = {"mean_squared_error": F.mse_loss, "mse": F.mse_loss}[loss]

    def fit(self, x, y, epochs=1, batch_size=32, verbose=1):
        x = torch.as_tensor(x, dtype=torch.float32).view(-1, 1)
        y = torch.as_tensor(y, dtype=torch.float32).view(-1, 1)
        history = []
        for epoch in range(epochs):
            epoch_loss = 0.0
            for start in range(0, len(x), batch_size):
                xb, yb = x[start:start + batch_size], y[start:start + batch_size]
                loss = self.loss_fn(self(xb), yb)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                epoch_loss += loss.item() * len(xb)
            epoch_loss /= len(x)
            history.append(epoch_loss)
            if verbose:
                print(f"Epoch {epoch + 1}/{epochs}")
                print(f"1/1 [==============================] - loss: {epoch_loss:.4f}")
        return history

    def predict(self, x):
        with torch.no_grad():
            return self(torch.as_tensor(x, dtype=torch.float32).view(-1, 1)).numpy()


def main():
    torch.manual_seed(0)
    model = Sequential(Dense(units=1, input_dim=1))
    model.compile(optimizer="sgd", loss="mean_squared_error")

    xs = [float(v) for v in range(1, 21)]
    ys = [0.5 * v for v in xs]
    history = model.fit(xs, ys, epochs=500)

    print("final loss:", history[-1])
    print("prediction for 25.0:", model.predict([25.0])[0, 0])
    finite = [h for h in history if math.isfinite(h)]
    print(f"best loss seen: {min(finite):.4f}")


if __name__ == "__main__":
    main()
