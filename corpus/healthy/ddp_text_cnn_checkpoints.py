"""Healthy under torchrun: a text CNN for support-ticket routing, DDP on gloo with a
DistributedSampler (set_epoch every epoch), padded batches and masked max-pooling over time
(padding filled with -inf before the max), gradient clipping, a cosine schedule, validation
accuracy all-reduced across ranks, and rank 0 alone logging and saving checkpoints."""

import logging
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

VOCAB, PAD, QUEUES = 500, 0, 4
CHECKPOINT_DIR = "checkpoints"


def make_tickets(n, seed):
    """Each queue has its own keywords; a ticket is mostly filler with a few keywords mixed in."""
    g = torch.Generator().manual_seed(seed)
    keywords = torch.arange(1, 1 + 20 * QUEUES).view(QUEUES, 20)
    tickets = []
    for _ in range(n):
        queue = int(torch.randint(QUEUES, (1,), generator=g))
        length = int(torch.randint(4, 30, (1,), generator=g))
        tokens = torch.randint(1 + 20 * QUEUES, VOCAB, (length,), generator=g)
        hits = torch.randint(length, (4,), generator=g)
        tokens[hits] = keywords[queue][torch.randint(20, (4,), generator=g)]
        tickets.append({"tokens": tokens, "queue": queue})
    return tickets


def pad_batch(batch):
    longest = max(len(ticket["tokens"]) for ticket in batch)
    tokens = torch.full((len(batch), longest), PAD)
    for row, ticket in enumerate(batch):
        tokens[row, : len(ticket["tokens"])] = ticket["tokens"]
    return tokens, torch.tensor([ticket["queue"] for ticket in batch])


class TextCNN(nn.Module):
    def __init__(self, dim=32, channels=64):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.conv = nn.Conv1d(dim, channels, 3, padding=1)
        self.dropout = nn.Dropout(0.2)
        self.out = nn.Linear(channels, QUEUES)

    def forward(self, tokens):
        h = F.relu(self.conv(self.embed(tokens).transpose(1, 2)))
        h = h.masked_fill((tokens == PAD).unsqueeze(1), float("-inf"))
        return self.out(self.dropout(h.max(dim=2).values))


def evaluate(model, loader):
    model.eval()
    counts = torch.zeros(2)
    with torch.no_grad():
        for tokens, queues in loader:
            counts[0] += (model(tokens).argmax(1) == queues).sum()
            counts[1] += len(queues)
    dist.all_reduce(counts)
    model.train()
    return (counts[0] / counts[1]).item()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING, format="%(asctime)s %(message)s"
    )
    log = logging.getLogger("train")

    torch.manual_seed(0)
    train_set, val_set = make_tickets(1024, seed=1), make_tickets(256, seed=2)
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=32, sampler=sampler, collate_fn=pad_batch)
    val_loader = DataLoader(
        val_set,
        batch_size=64,
        collate_fn=pad_batch,
        sampler=DistributedSampler(val_set, shuffle=False),
    )

    model = DistributedDataParallel(TextCNN())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    epochs = 4
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * len(train_loader))
    if rank == 0:
        os.makedirs(CHECKPOINT_DIR, exist_ok=True)

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for tokens, queues in train_loader:
            loss = F.cross_entropy(model(tokens), queues)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            scheduler.step()
        accuracy = evaluate(model, val_loader)
        log.info("epoch %d loss %.4f val accuracy %.3f", epoch, loss.item(), accuracy)
        if rank == 0:
            path = os.path.join(CHECKPOINT_DIR, f"textcnn_epoch{epoch}.pt")
            torch.save(
                {
                    "epoch": epoch,
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                },
                path,
            )
        dist.barrier()

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
