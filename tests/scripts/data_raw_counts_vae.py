"""Planted bug: a small VAE is trained on raw detector counts (hundreds to thousands) instead
of normalized images. The encoder's features are in the thousands, the first Adam step moves
the log-variance head far enough that exp() overflows, and the loss is nan."""

import torch
from torch import nn

torch.manual_seed(0)
centers = torch.rand(8, 64) * 3000 + 500
images = centers[torch.randint(0, 8, (512,))] + 50 * torch.randn(512, 64)
dataset = torch.utils.data.TensorDataset(images)  # counts, not normalized
loader = torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True)


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(64, 32), nn.LeakyReLU())
        self.mean = nn.Linear(32, 4)
        self.log_sd = nn.Linear(32, 4)
        self.decoder = nn.Sequential(nn.Linear(4, 32), nn.LeakyReLU(), nn.Linear(32, 64))

    def forward(self, x):
        h = self.encoder(x)
        mean, log_sd = self.mean(h), self.log_sd(h)
        z = mean + torch.exp(log_sd) * torch.randn_like(mean)
        return self.decoder(z), mean, log_sd


model = VAE()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(3):
    for (x,) in loader:
        recon, mean, log_sd = model(x)
        kl = (-log_sd + 0.5 * torch.exp(log_sd) ** 2 + 0.5 * mean**2 - 0.5).sum(1).mean()
        loss = 0.5 * ((recon - x) ** 2).sum(1).mean() + kl
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(epoch, loss.item())
