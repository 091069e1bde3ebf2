"""Intent classification with a small Transformer encoder, trained with Accelerate in
bf16 mixed precision, gradient accumulation (4 micro-batches per optimizer step),
gradient-norm clipping under `accelerator.sync_gradients`, and a linear-warmup /
cosine-decay schedule.  Padded key positions are masked with -inf before the
softmax; every sequence keeps its [CLS] token, so no attention row is fully masked.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from accelerate import Accelerator
from accelerate.utils import set_seed

PAD, CLS = 0, 1


class IntentDataset(Dataset):
    """Variable-length token sequences whose class is set by a few trigger tokens."""

    def __init__(self, n, vocab, num_classes, max_len, seed):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        triggers = torch.arange(2, 2 + 3 * num_classes).view(num_classes, 3)
        for _ in range(n):
            label = int(torch.randint(0, num_classes, (1,), generator=g))
            length = int(torch.randint(6, max_len, (1,), generator=g))
            toks = torch.randint(2 + 3 * num_classes, vocab, (length,), generator=g)
            pos = torch.randperm(length, generator=g)[:2]
            toks[pos] = triggers[label][torch.randint(0, 3, (2,), generator=g)]
            self.items.append((torch.cat([torch.tensor([CLS]), toks]), label))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    width = max(len(t) for t, _ in batch)
    ids = torch.full((len(batch), width), PAD, dtype=torch.long)
    for i, (t, _) in enumerate(batch):
        ids[i, : len(t)] = t
    return {"input_ids": ids, "labels": torch.tensor([y for _, y in batch])}


class EncoderLayer(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, pad_mask):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(D // self.heads)
        scores = scores.masked_fill(pad_mask[:, None, None, :], float("-inf"))
        attn = scores.softmax(dim=-1)
        x = x + self.out((attn @ v).transpose(1, 2).reshape(B, T, D))
        return x + self.ff(self.ln2(x))


class IntentClassifier(nn.Module):
    def __init__(self, vocab, num_classes, d=64, heads=4, layers=2, max_len=48):
        super().__init__()
        self.tok = nn.Embedding(vocab, d, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, d)
        self.layers = nn.ModuleList([EncoderLayer(d, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.cls = nn.Linear(d, num_classes)

    def forward(self, input_ids):
        pad_mask = input_ids.eq(PAD)
        x = self.tok(input_ids) + self.pos(torch.arange(input_ids.size(1), device=input_ids.device))
        for layer in self.layers:
            x = layer(x, pad_mask)
        return self.cls(self.norm(x[:, 0]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mixed_precision", default="bf16")
    ap.add_argument("--gradient_accumulation_steps", type=int, default=4)
    ap.add_argument("--micro_batch_size", type=int, default=16)
    ap.add_argument("--num_epochs", type=int, default=3)
    ap.add_argument("--learning_rate", type=float, default=2e-3)
    ap.add_argument("--warmup_steps", type=int, default=6)
    ap.add_argument("--max_grad_norm", type=float, default=1.0)
    args = ap.parse_args()

    accelerator = Accelerator(
        cpu=True,
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
    )
    set_seed(42)
    vocab, num_classes = 200, 4
    train_ds = IntentDataset(768, vocab, num_classes, max_len=40, seed=0)
    loader = DataLoader(train_ds, batch_size=args.micro_batch_size, shuffle=True, collate_fn=collate)
    model = IntentClassifier(vocab, num_classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.01)

    total_updates = args.num_epochs * math.ceil(len(loader) / args.gradient_accumulation_steps)

    def lr_lambda(step):
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        progress = (step - args.warmup_steps) / max(1, total_updates - args.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    update = 0
    for epoch in range(args.num_epochs):
        model.train()
        correct = seen = 0
        for batch in loader:
            with accelerator.accumulate(model):
                logits = model(batch["input_ids"])
                loss = F.cross_entropy(logits.float(), batch["labels"])
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            correct += (logits.argmax(-1) == batch["labels"]).sum().item()
            seen += batch["labels"].numel()
            if accelerator.sync_gradients:
                update += 1
                if update % 4 == 0:
                    accelerator.print(
                        f"epoch {epoch} update {update:3d}  loss {loss.item():.4f}  "
                        f"grad_norm {float(grad_norm):.3f}  lr {scheduler.get_last_lr()[0]:.2e}"
                    )
        accelerator.print(f"epoch {epoch} train accuracy {correct / seen:.3f}")


if __name__ == "__main__":
    main()
