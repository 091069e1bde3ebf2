"""REINFORCE on a toy grid game with invalid-action masking by -inf logits.

Illegal actions get a logit of float('-inf') before building the Categorical distribution, so
their probability is exactly 0 and they are never sampled.  log_prob is only evaluated for the
sampled (legal) actions and Categorical.entropy() handles the -inf logits (it clamps them to
the smallest finite value before computing p * log p), so the -inf values stay confined to
the masked entries and training is clean.
"""
import torch
import torch.nn as nn
from torch.distributions import Categorical

torch.manual_seed(0)
N_ACTIONS = 6


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, N_ACTIONS))

    def forward(self, obs, legal):
        logits = self.net(obs)
        logits = logits.masked_fill(~legal, float("-inf"))
        return Categorical(logits=logits)


def env_batch(n=64):
    obs = torch.randn(n, 8)
    legal = torch.rand(n, N_ACTIONS) < 0.6
    legal[torch.arange(n), torch.randint(0, N_ACTIONS, (n,))] = True   # at least one legal move
    best = (obs[:, :N_ACTIONS] + 10 * legal.float()).argmax(dim=1)
    return obs, legal, best


policy = Policy()
opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
baseline = 0.0
for it in range(120):
    obs, legal, best = env_batch()
    dist = policy(obs, legal)
    action = dist.sample()
    reward = (action == best).float()
    baseline = 0.9 * baseline + 0.1 * reward.mean().item()
    loss = -((reward - baseline) * dist.log_prob(action)).mean() - 0.01 * dist.entropy().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if it % 20 == 0:
        print(f"iter {it:3d}  mean reward {reward.mean().item():.3f}  entropy {dist.entropy().mean().item():.3f}")
