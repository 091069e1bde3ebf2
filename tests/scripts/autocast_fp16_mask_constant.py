"""Attention pooling over a padded click history under float16 autocast. Padded slots get
`(1 - mask) * -1e9` added to their scores: in float32 a user without history gets uniform
attention, but -1e9 is beyond float16's range, so under autocast it is -inf, a row with every
slot padded is all -inf, and its softmax is 0/0."""

import torch

torch.manual_seed(0)
n_users, slots, dim = 512, 8, 16
history = torch.randn(n_users, slots, dim)
lengths = torch.randint(1, slots + 1, (n_users,))
lengths[::97] = 0  # new users: no clicks yet
mask = (torch.arange(slots)[None, :] < lengths[:, None]).float()
candidates = torch.randn(n_users, dim)
labels = (candidates[:, 0] > 0).float()


class HistoryAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.query = torch.nn.Linear(dim, dim)
        self.key = torch.nn.Linear(dim, dim)
        self.score = torch.nn.Linear(2 * dim, 1)

    def forward(self, history, mask, candidate):
        q = self.query(candidate).unsqueeze(1)
        k = self.key(history)
        scores = torch.bmm(q, k.transpose(1, 2)).squeeze(1) / dim**0.5
        scores = scores + (1.0 - mask.to(scores.dtype)) * -1e9
        weights = torch.softmax(scores, dim=-1)
        user = torch.bmm(weights.unsqueeze(1), history).squeeze(1)
        return self.score(torch.cat([user, candidate], dim=-1)).squeeze(-1)


model = HistoryAttention()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(60):
    batch = torch.randint(0, n_users, (64,))
    with torch.autocast("cpu", dtype=torch.float16):
        logits = model(history[batch], mask[batch], candidates[batch])
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels[batch])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}")
