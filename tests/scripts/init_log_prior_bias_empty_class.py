"""A multi-label classifier whose output bias starts at each label's log prior odds (a common
trick for imbalanced labels). One label never occurs in the training set, so its prior is 0 and
its bias -inf."""

import torch
import torch.nn as nn


def prior_log_odds(labels):
    positives = labels.sum(dim=0)
    log_odds = torch.log(positives / (len(labels) - positives))  # the line to fix: 0 positives
    return log_odds


torch.manual_seed(0)
x = torch.randn(400, 12)
labels = (x[:, :5] > 0.8).float()
labels[:, 3] = 0.0  # nobody annotated this label
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 5))
model[2].bias = nn.Parameter(prior_log_odds(labels))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(20):
    loss = nn.functional.binary_cross_entropy_with_logits(model(x), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
