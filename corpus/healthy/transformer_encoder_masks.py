"""Healthy: next-token prediction on variable-length integer sequences with nn.TransformerEncoder,
a square subsequent (causal) mask plus a key padding mask from a padding collate_fn, a
DataLoader with shuffling, and a torch.no_grad() validation loop. Masked attention scores are
-inf inside the kernel by design; no NaN/Inf reaches the loss."""

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

PAD, VOCAB = 0, 20


class CountingSequences(Dataset):
    """Sequences that count up by a fixed stride (mod VOCAB - 1), of random length."""

    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.seqs = []
        for _ in range(n):
            length = int(torch.randint(5, 17, (1,), generator=g))
            start, stride = torch.randint(0, VOCAB - 1, (2,), generator=g).tolist()
            self.seqs.append((start + stride * torch.arange(length)) % (VOCAB - 1) + 1)

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i]


def collate(batch):
    return pad_sequence(batch, batch_first=True, padding_value=PAD)


class Model(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d, padding_idx=PAD)
        self.pos = nn.Parameter(0.02 * torch.randn(32, d))
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(d, VOCAB)

    def forward(self, tokens):
        t = tokens.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(t)
        h = self.embed(tokens) + self.pos[:t]
        padding = torch.zeros(tokens.shape).masked_fill(tokens == PAD, float("-inf"))
        h = self.encoder(h, mask=causal, src_key_padding_mask=padding, is_causal=True)
        return self.out(h)


def run_epoch(model, loader, optimizer=None):
    total, count = 0.0, 0
    for tokens in loader:
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1), ignore_index=PAD
        )
        if optimizer is not None:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        total, count = total + loss.item(), count + 1
    return total / count


torch.manual_seed(0)
train = DataLoader(CountingSequences(512, 0), batch_size=32, shuffle=True, collate_fn=collate)
val = DataLoader(CountingSequences(128, 1), batch_size=64, collate_fn=collate)
model = Model()
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
for epoch in range(4):
    model.train()
    train_loss = run_epoch(model, train, optimizer)
    model.eval()
    with torch.no_grad():
        val_loss = run_epoch(model, val)
    print(f"epoch {epoch} train {train_loss:.4f} val {val_loss:.4f}")
