"""Supervised-contrastive fine-tuning of a tiny BERT intent encoder with the HF Trainer.

Help-desk tickets are embedded with a small BertModel (built from a BertConfig) plus a
projection head; the embeddings are trained with the SupCon loss (Khosla et al.) so that
tickets of the same intent cluster together, before a nearest-centroid router is fitted
on top.  Text has no cheap augmentation, so every ticket is a single view and the
positives of an anchor are the other tickets of its intent in the batch.  The loss is
HobbitLong/SupContrast's SupConLoss, called from a Trainer.compute_loss override.

The export from the ticket system has a long tail: next to four frequent intents there
is one GDPR erasure request.  In the batch that contains it, that anchor has no positive
at all, mask.sum(1) is 0 and the mean log-probability over positives is 0 / 0 = NaN; the
loss of that step is nan, the backward pass fills every gradient with NaN and the weights
follow, so every later logged loss is nan as well.

Reproduces: https://github.com/HobbitLong/SupContrast/issues/141 ("NaN loss for no
positive pair from SupCon"), fixed upstream by PR #142 (commit 72fd989, "fix: nan loss
values"), which replaces a zero positive count with 1 before dividing:
mask_pos_pairs = torch.where(mask_pos_pairs < 1e-6, 1, mask_pos_pairs).
"""
import random
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import BertConfig, BertModel, Trainer, TrainingArguments

CONFIG = {
    "seed": 2,
    "tickets_per_intent": 400,
    "max_len": 16,
    "batch_size": 32,
    "epochs": 2,
    "lr": 3e-4,
    "temperature": 0.1,
}

INTENTS = {
    "billing": (["charged", "twice", "invoice", "card", "payment", "bill", "amount"], "my {} was wrong please check the {}"),
    "shipping": (["parcel", "delivery", "courier", "package", "tracking", "late", "box"], "where is my {} the {} has not arrived"),
    "login": (["password", "login", "account", "locked", "code", "reset", "email"], "i cannot {} my {} does not work"),
    "refund": (["refund", "return", "money", "back", "broken", "item", "order"], "i want a {} for the {} i sent back"),
}
RARE = [("gdpr_erasure", "please delete all personal data you hold about me under gdpr")]


def build_tickets(rng):
    rows = []
    for intent, (keywords, template) in INTENTS.items():
        for _ in range(CONFIG["tickets_per_intent"]):
            text = template.format(rng.choice(keywords), rng.choice(keywords))
            noise = " ".join(rng.choice(["hi", "thanks", "asap", "today", "again", "hello", "urgent"])
                             for _ in range(rng.randint(0, 3)))
            rows.append(((noise + " " + text).strip(), intent))
    rows.extend(RARE)
    rng.shuffle(rows)
    return rows


class TicketDataset(Dataset):
    def __init__(self, rows, vocab, label_ids):
        self.rows, self.vocab, self.label_ids = rows, vocab, label_ids

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        text, intent = self.rows[i]
        ids = [1] + [self.vocab[w] for w in text.split()][: CONFIG["max_len"] - 1]
        return {"input_ids": ids, "labels": self.label_ids[intent]}


def collate(batch):
    width = max(len(b["input_ids"]) for b in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    for k, b in enumerate(batch):
        ids[k, :len(b["input_ids"])] = torch.tensor(b["input_ids"])
    return {"input_ids": ids, "attention_mask": (ids != 0).long(),
            "labels": torch.tensor([b["labels"] for b in batch])}


class SupConLoss(nn.Module):
    """Supervised Contrastive Learning loss (HobbitLong/SupContrast), contrast_mode='all'."""

    def __init__(self, temperature=0.07, base_temperature=0.07):
        super().__init__()
        self.temperature = temperature
        self.base_temperature = base_temperature

    def forward(self, features, labels):
        batch_size, contrast_count = features.shape[0], features.shape[1]
        labels = labels.contiguous().view(-1, 1)
        mask = torch.eq(labels, labels.T).float()

        contrast_feature = torch.cat(torch.unbind(features, dim=1), dim=0)
        anchor_feature, anchor_count = contrast_feature, contrast_count
        anchor_dot_contrast = torch.matmul(anchor_feature, contrast_feature.T) / self.temperature
        logits_max, _ = torch.max(anchor_dot_contrast, dim=1, keepdim=True)
        logits = anchor_dot_contrast - logits_max.detach()

        mask = mask.repeat(anchor_count, contrast_count)
        logits_mask = torch.scatter(torch.ones_like(mask), 1,
                                    torch.arange(batch_size * anchor_count).view(-1, 1), 0)
        mask = mask * logits_mask

        exp_logits = torch.exp(logits) * logits_mask
        log_prob = logits - torch.log(exp_logits.sum(1, keepdim=True))
        mean_log_prob_pos = (mask * log_prob).sum(1) / mask.sum(1)

        loss = -(self.temperature / self.base_temperature) * mean_log_prob_pos
        return loss.view(anchor_count, batch_size).mean()


class IntentEncoder(nn.Module):
    def __init__(self, config, proj_dim=32):
        super().__init__()
        self.bert = BertModel(config, add_pooling_layer=False)
        self.head = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.ReLU(),
                                  nn.Linear(config.hidden_size, proj_dim))

    def forward(self, input_ids, attention_mask):
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).float()
        pooled = (hidden * m).sum(1) / m.sum(1)
        return F.normalize(self.head(pooled), dim=-1)


class SupConTrainer(Trainer):
    def __init__(self, *args, criterion=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.criterion = criterion

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        embeddings = model(**inputs)
        loss = self.criterion(embeddings.unsqueeze(1), labels)   # one view per ticket
        return (loss, {"embeddings": embeddings}) if return_outputs else loss


def main():
    torch.set_num_threads(1)
    random.seed(CONFIG["seed"])
    torch.manual_seed(CONFIG["seed"])
    rows = build_tickets(random.Random(CONFIG["seed"]))
    words = sorted({w for text, _ in rows for w in text.split()})
    vocab = {w: i + 2 for i, w in enumerate(words)}          # 0 = [PAD], 1 = [CLS]
    label_ids = {name: i for i, name in enumerate(list(INTENTS) + [r[1] for r in RARE])}
    print(f"{len(rows)} tickets, {len(label_ids)} intents, vocab {len(vocab) + 2}")

    config = BertConfig(vocab_size=len(vocab) + 2, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=CONFIG["max_len"] + 4)
    model = IntentEncoder(config)

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="supcon_intents_"),
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        num_train_epochs=CONFIG["epochs"],
        per_device_train_batch_size=CONFIG["batch_size"],
        learning_rate=CONFIG["lr"],
        warmup_steps=10,
        dataloader_drop_last=True,
        logging_steps=5,
        logging_nan_inf_filter=False,
        remove_unused_columns=False,
        disable_tqdm=True,
        seed=CONFIG["seed"],
    )
    trainer = SupConTrainer(model=model, args=args,
                            train_dataset=TicketDataset(rows, vocab, label_ids),
                            data_collator=collate,
                            criterion=SupConLoss(temperature=CONFIG["temperature"]))
    trainer.train()


if __name__ == "__main__":
    main()
