"""Planted bug: a pairwise ranking loss averages over the answer pairs of each question, and a
question with a single answer has no pairs: the mean over an empty tensor is 0/0 = NaN."""

import torch
import torch.nn.functional as F

torch.manual_seed(0)
scorer = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(scorer.parameters(), lr=0.1)
answers = torch.randn(5, 4)
questions = [(0, 3), (3, 4), (4, 5)]  # answers [start, end) per question: two have one answer

for step in range(3):
    rewards = scorer(answers)
    losses = []
    for start, end in questions:
        pairs = torch.combinations(torch.arange(end - start), 2)
        better, worse = rewards[start + pairs[:, 0]], rewards[start + pairs[:, 1]]
        losses.append(-F.logsigmoid(better - worse).mean())
    loss = torch.stack(losses).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
