"""Planted bug: advantages are normalized per minibatch with the sample std, and the last
minibatch of an epoch holds a single transition: its std (n - 1 = 0 in the denominator) is
NaN, and so is the policy loss."""

import torch
from torch import nn

torch.manual_seed(0)
policy = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
optimizer = torch.optim.Adam(policy.parameters(), lr=3e-4)
states = torch.randn(33, 4)  # 33 transitions in minibatches of 8: the last holds one
actions = torch.randint(0, 2, (33,))
returns = torch.randn(33)

for epoch in range(3):
    for start in range(0, len(states), 8):
        s, a, adv = (
            states[start : start + 8],
            actions[start : start + 8],
            returns[start : start + 8],
        )
        log_prob = torch.log_softmax(policy(s), dim=-1).gather(1, a[:, None]).squeeze(1)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        loss = -(log_prob * adv).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"epoch {epoch} start {start} loss {loss.item():.4f}")
