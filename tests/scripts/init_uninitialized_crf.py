"""Planted bug: a tagger's CRF creates its transition scores with `torch.empty` and never fills
them; the tagger's own init only visits Linear layers. In deterministic mode torch fills
uninitialised memory with NaN, so the first negative log-likelihood is nan."""

import torch
from torch import nn

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.utils.deterministic.fill_uninitialized_memory = True


class CRF(nn.Module):
    def __init__(self, tags):
        super().__init__()
        self.start = nn.Parameter(torch.empty(tags))  # the line to fix: never initialized
        self.transitions = nn.Parameter(torch.empty(tags, tags))

    def forward(self, emissions, tags):
        # log-likelihood of the gold path against all paths (forward algorithm)
        gold = self.start[tags[:, 0]] + emissions[:, 0].gather(1, tags[:, :1]).squeeze(1)
        alpha = self.start + emissions[:, 0]
        for t in range(1, emissions.shape[1]):
            gold = gold + self.transitions[tags[:, t - 1], tags[:, t]]
            gold = gold + emissions[:, t].gather(1, tags[:, t : t + 1]).squeeze(1)
            alpha = torch.logsumexp(alpha.unsqueeze(2) + self.transitions, dim=1) + emissions[:, t]
        return (torch.logsumexp(alpha, dim=1) - gold).mean()


class Tagger(nn.Module):
    def __init__(self, vocab=50, dim=16, tags=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, tags)
        self.crf = CRF(tags)

    def forward(self, words, tags):
        return self.crf(self.proj(self.embed(words)), tags)


def init_linear(module):
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        nn.init.zeros_(module.bias)


model = Tagger()
model.apply(init_linear)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(10):
    words = torch.randint(0, 50, (8, 12))
    tags = torch.randint(0, 5, (8, 12))
    loss = model(words, tags)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
