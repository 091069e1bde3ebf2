"""Token tagging where unlabelled tokens carry -100; one batch holds no labelled token at all."""

import torch
import torch.nn as nn

torch.manual_seed(0)
tokens = torch.randint(0, 50, (96, 8))
labels = torch.randint(0, 5, (96, 8))
labels[32:48] = -100  # sentences nobody annotated
model = nn.Sequential(nn.Embedding(50, 16), nn.Linear(16, 5))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
criterion = nn.CrossEntropyLoss(ignore_index=-100)
for epoch in range(2):
    for start in range(0, 96, 16):
        logits = model(tokens[start : start + 16])
        loss = criterion(logits.reshape(-1, 5), labels[start : start + 16].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(epoch, start, loss.item())
