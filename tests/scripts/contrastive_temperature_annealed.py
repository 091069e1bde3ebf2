"""A hand-written InfoNCE loss whose temperature is annealed down every step: each positive
pair's similarity is close to 1, so exp(similarity / temperature) overflows float32 once
1 / temperature passes 88.7 (step ~56), at any learning rate. The fix is the formula
(`F.cross_entropy` on the logits, i.e. log-sum-exp) or a floor on the temperature."""

import torch
from torch import nn

torch.manual_seed(0)
x = torch.randn(64, 16)
encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1)
for step in range(120):
    temperature = 0.2 * 0.95**step
    view_a = nn.functional.normalize(encoder(x + 0.05 * torch.randn_like(x)), dim=1)
    view_b = nn.functional.normalize(encoder(x + 0.05 * torch.randn_like(x)), dim=1)
    similarity = torch.exp(view_a @ view_b.T / temperature)
    loss = -torch.log(similarity.diag() / similarity.sum(dim=1)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
