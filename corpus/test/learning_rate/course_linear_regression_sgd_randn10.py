"""Linear regression from the "PyTorch for Deep Learning and Computer Vision" course notebook.

100 noisy points around y = x (x drawn from N(0, 10^2)), a one-unit nn.Linear wrapped in an
LR module, MSE loss and plain SGD.  The plotting cells of the notebook are replaced by prints;
the number of epochs was raised from 100 to 500 to get a tighter fit.
"""
import torch
import torch.nn as nn

torch.manual_seed(5)
X = torch.randn(100, 1) * 10
y = X + 3 * torch.randn(100, 1)


class LR(nn.Module):
    def __init__(self, input_size, output_size):
        super().__init__()
        self.linear = nn.Linear(input_size, output_size)

    def forward(self, x):
        pred = self.linear(x)
        return pred


torch.manual_seed(1)
model = LR(1, 1)
print(model)
[w, b] = model.parameters()


def get_params():
    return (w[0][0].item(), b[0].item())


print("initial model: w = %.4f, b = %.4f" % get_params())

criterion = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

epochs = 500
losses = []
for i in range(epochs):
    y_pred = model.forward(X)
    loss = criterion(y_pred, y)
    print("epoch:", i, "loss:", loss.item())

    losses.append(loss.item())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

print("trained model: w = %.4f, b = %.4f" % get_params())
