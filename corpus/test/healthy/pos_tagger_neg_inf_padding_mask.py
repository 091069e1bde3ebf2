"""Toy part-of-speech tagger trained with the Hugging Face Trainer.

A small transformer encoder (PreTrainedModel subclass) tags every token of synthetic
sentences generated from a tiny grammar.  Batches are padded dynamically by the collator;
padded keys get -inf attention scores, every sentence starts with a [CLS] token, and padded
positions carry the label -100 so the token-classification loss skips them.
"""
import argparse
import math
import random
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments
from transformers.modeling_outputs import TokenClassifierOutput

TAGS = ["CLS", "DET", "ADJ", "NOUN", "VERB", "ADV", "PREP"]
LEXICON = {
    "DET": ["the", "a", "every", "some"],
    "ADJ": ["small", "red", "quiet", "old", "bright"],
    "NOUN": ["cat", "river", "teacher", "garden", "train", "book"],
    "VERB": ["sees", "likes", "follows", "paints", "finds"],
    "ADV": ["slowly", "often", "never", "quickly"],
    "PREP": ["near", "under", "behind", "with"],
}


def noun_phrase(rng):
    out = [("DET", rng.choice(LEXICON["DET"]))]
    for _ in range(rng.randint(0, 2)):
        out.append(("ADJ", rng.choice(LEXICON["ADJ"])))
    out.append(("NOUN", rng.choice(LEXICON["NOUN"])))
    return out


def sentence(rng):
    sent = noun_phrase(rng)
    if rng.random() < 0.4:
        sent.append(("ADV", rng.choice(LEXICON["ADV"])))
    sent.append(("VERB", rng.choice(LEXICON["VERB"])))
    sent += noun_phrase(rng)
    if rng.random() < 0.5:
        sent.append(("PREP", rng.choice(LEXICON["PREP"])))
        sent += noun_phrase(rng)
    return sent


class TaggerConfig(PretrainedConfig):
    model_type = "toy_tagger"

    def __init__(self, vocab_size=40, d_model=48, n_heads=4, n_layers=2, d_ff=96, max_len=32,
                 num_tags=len(TAGS), **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_model, self.n_heads = vocab_size, d_model, n_heads
        self.n_layers, self.d_ff, self.max_len, self.num_tags = n_layers, d_ff, max_len, num_tags


class EncoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.h = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ff = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))

    def forward(self, x, key_padding):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.h)
        scores = scores.masked_fill(key_padding[:, None, None, :], float("-inf"))
        att = scores.softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.ln2(x))


class TaggerModel(PreTrainedModel):
    config_class = TaggerConfig

    def __init__(self, config):
        super().__init__(config)
        self.tok = nn.Embedding(config.vocab_size, config.d_model, padding_idx=0)
        self.pos = nn.Embedding(config.max_len, config.d_model)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.num_tags)
        self.post_init()

    def forward(self, input_ids, attention_mask, labels=None, **kwargs):
        pos = torch.arange(input_ids.size(1), device=input_ids.device)
        x = self.tok(input_ids) + self.pos(pos)
        key_padding = attention_mask == 0
        for layer in self.layers:
            x = layer(x, key_padding)
        logits = self.head(self.norm(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), ignore_index=-100)
        return TokenClassifierOutput(loss=loss, logits=logits)


def build_examples(n, vocab, rng):
    examples = []
    for _ in range(n):
        sent = sentence(rng)
        ids = [vocab["[CLS]"]] + [vocab[w] for _, w in sent]
        tags = [TAGS.index("CLS")] + [TAGS.index(t) for t, _ in sent]
        examples.append({"input_ids": ids, "labels": tags})
    return examples


def collate(batch):
    width = max(len(ex["input_ids"]) for ex in batch)
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, ex in enumerate(batch):
        n = len(ex["input_ids"])
        ids[i, :n] = torch.tensor(ex["input_ids"])
        mask[i, :n] = 1
        labels[i, :n] = torch.tensor(ex["labels"])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    torch.manual_seed(0)
    rng = random.Random(0)
    words = sorted({w for ws in LEXICON.values() for w in ws})
    vocab = {"[PAD]": 0, "[CLS]": 1, **{w: i + 2 for i, w in enumerate(words)}}
    train = build_examples(256, vocab, rng)
    dev = build_examples(64, vocab, rng)

    model = TaggerModel(TaggerConfig(vocab_size=len(vocab)))
    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        num_train_epochs=args.epochs,
        learning_rate=args.lr,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64,
        lr_scheduler_type="cosine",
        warmup_steps=4,
        logging_steps=4,
        eval_strategy="epoch",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
        seed=0,
    )

    def token_accuracy(pred):
        preds = pred.predictions.argmax(-1)
        keep = pred.label_ids != -100
        return {"token_acc": float((preds[keep] == pred.label_ids[keep]).mean())}

    trainer = Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=dev,
                      data_collator=collate, compute_metrics=token_accuracy)
    trainer.train()
    metrics = trainer.evaluate()
    print("dev loss %.4f  token accuracy %.3f" % (metrics["eval_loss"], metrics["eval_token_acc"]))


if __name__ == "__main__":
    main()
