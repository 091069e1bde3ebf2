"""A text classifier whose parts are initialized out of scale: embeddings x100, a bias of 30,
a recurrent weight x10, a BatchNorm with zero running variance and a head x50."""

import torch
import torch.nn as nn


class Classifier(nn.Module):
    def __init__(self, vocab=200, dim=32, classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.rnn = nn.RNN(dim, dim, batch_first=True)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.BatchNorm1d(dim)
        self.head = nn.Linear(dim, classes)
        with torch.no_grad():
            self.embed.weight.mul_(100.0)
            self.rnn.weight_hh_l0.mul_(10.0)
            self.proj.bias.fill_(30.0)
            self.norm.running_var.zero_()
            self.head.weight.mul_(50.0)

    def forward(self, tokens):
        hidden, _ = self.rnn(torch.tanh(self.embed(tokens) / 100.0))
        features = self.norm(torch.relu(self.proj(hidden[:, -1])))
        return self.head(features)


torch.manual_seed(0)
model = Classifier()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
for step in range(5):
    tokens = torch.randint(0, 200, (16, 12))
    labels = torch.randint(0, 10, (16,))
    loss = nn.functional.cross_entropy(model(tokens), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
