"""A character RNN in the style of the old name-classification tutorial: the hidden state is a
linear layer of (input, hidden) with no squashing non-linearity, parameters are updated by
hand (`p.data.add_(p.grad, alpha=-lr)`) and the gradient is never clipped. Most names are
short; once the recurrent weights have grown, a long one sends the backward pass through a
product of many linear steps, the gradient explodes and the update overflows the weights.
Clipping the gradient norm after backward() keeps the rate and trains.
"""

import torch
import torch.nn as nn

torch.manual_seed(0)
N_LETTERS, N_HIDDEN, N_CLASSES = 12, 48, 3


class RNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.i2h = nn.Linear(N_LETTERS + N_HIDDEN, N_HIDDEN)
        self.i2o = nn.Linear(N_LETTERS + N_HIDDEN, N_CLASSES)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, letter, hidden):
        combined = torch.cat((letter, hidden), 1)
        return self.softmax(self.i2o(combined)), self.i2h(combined)


def random_name():
    label = torch.randint(N_CLASSES, (1,))
    length = int(torch.randint(3, 8, ()).item())
    if torch.rand(()) < 0.02:
        length = int(torch.randint(20, 40, ()).item())  # a rare long compound name
    letters = (torch.randint(4, (length,)) + 4 * label) % N_LETTERS
    return nn.functional.one_hot(letters, N_LETTERS).float().unsqueeze(1), label


rnn = RNN()
criterion = nn.NLLLoss()
learning_rate = 0.01
for step in range(1200):
    name, label = random_name()
    hidden = torch.zeros(1, N_HIDDEN)
    rnn.zero_grad()
    for letter in name:
        output, hidden = rnn(letter, hidden)
    loss = criterion(output, label)
    loss.backward()
    for p in rnn.parameters():
        p.data.add_(p.grad, alpha=-learning_rate)
    if step % 100 == 0:
        print(f"step {step} loss {loss.item():.4f}")
