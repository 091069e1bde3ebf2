"""Reward-model training on WebGPT-style answer comparisons with Accelerate.

Each comparison row holds a question, two candidate answers (with inline citation
markers such as "[2]") and a preference score for each.  Answers are grouped per
question, sorted best-first, and a small GPT-2 reward head is trained with the
pairwise ranking loss used by Open-Assistant (-log sigmoid(r_better - r_worse) plus
a small L2 penalty on the rewards).
"""
import random
import re
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2ForSequenceClassification

from accelerate import Accelerator
from accelerate.utils import set_seed

re_reference_remove = re.compile(r"\[\d+(?:,\s*\d+)*?\]")

CONFIG = {
    "num_rows": 320,
    "max_answers": 5,
    "max_length": 48,
    "batch_size": 8,
    "gradient_accumulation_steps": 1,
    "learning_rate": 2e-4,
    "num_epochs": 1,
    "beta": 0.001,
    "seed": 11,
}

TOPICS = ["river", "planet", "enzyme", "market", "engine", "poem", "virus", "bridge", "glacier", "ledger"]
FILLER = ["the", "a", "is", "of", "and", "to", "it", "that", "which", "because", "when", "for"]
GOOD = ["evidence", "measured", "source", "study", "explains", "specifically", "data", "shows"]
BAD = ["maybe", "guess", "whatever", "unsure", "probably", "dunno"]


def make_comparisons(n, rng):
    """Synthetic stand-in for openai/webgpt_comparisons."""
    rows = []
    for i in range(n):
        topic = rng.choice(TOPICS)
        question = f"why does the {topic} {rng.choice(['change', 'fail', 'grow', 'move'])} q{i % 150}"

        def answer(quality):
            words = [rng.choice(FILLER) for _ in range(rng.randint(6, 12))]
            pool = GOOD if quality > 0 else BAD
            words += [rng.choice(pool) for _ in range(rng.randint(2, 4))]
            rng.shuffle(words)
            cites = "".join(f"[{rng.randint(1, 9)}]" for _ in range(rng.randint(0, 2)))
            return " ".join([topic] + words) + " " + cites

        if i % 79 == 41:
            # browsing ran out of steps: the answer is only the quote markers
            a0, a1 = "[1]", "[1][2]"
            s0, s1 = 0.0, 0.0
        else:
            better = rng.random() < 0.5
            a0, a1 = answer(1 if better else -1), answer(-1 if better else 1)
            s0, s1 = (1.0, -1.0) if better else (-1.0, 1.0)
        rows.append({"question": question, "answer_0": a0, "answer_1": a1, "score_0": s0, "score_1": s1})
    return rows


class WebGPTComparisons(Dataset):
    def __init__(self, rows, max_answers=5):
        self.questions, self.answers = [], []
        question_answer_dict = defaultdict(dict)
        for row in rows:
            question = row["question"]
            answer_0 = re_reference_remove.sub("", row["answer_0"]).strip()
            answer_1 = re_reference_remove.sub("", row["answer_1"]).strip()
            question_answer_dict[question][answer_0] = row["score_0"]
            question_answer_dict[question][answer_1] = row["score_1"]

        for question, answers in question_answer_dict.items():
            self.questions.append(question)
            answers_sorted = [a for a, _ in sorted(answers.items(), key=lambda kv: -kv[1])]
            self.answers.append(answers_sorted[:max_answers])

    def __len__(self):
        return len(self.questions)

    def __getitem__(self, idx):
        return self.questions[idx], self.answers[idx]


class WordTokenizer:
    def __init__(self, texts):
        vocab = sorted({w for t in texts for w in t.split()})
        self.pad_id, self.sep_id = 0, 1
        self.ids = {w: i + 2 for i, w in enumerate(vocab)}

    def __len__(self):
        return len(self.ids) + 2

    def encode(self, text):
        return [self.ids[w] for w in text.split()]


class RankingCollator:
    def __init__(self, tokenizer, max_length):
        self.tok = tokenizer
        self.max_length = max_length

    def __call__(self, batch):
        seqs, cu_lengths = [], [0]
        for question, answers in batch:
            q = self.tok.encode(question)
            for a in answers:
                seqs.append((q + [self.tok.sep_id] + self.tok.encode(a))[: self.max_length])
            cu_lengths.append(cu_lengths[-1] + len(answers))
        width = max(len(s) for s in seqs)
        input_ids = torch.full((len(seqs), width), self.tok.pad_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, s in enumerate(seqs):
            input_ids[i, : len(s)] = torch.tensor(s)
            attention_mask[i, : len(s)] = 1
        return {"input_ids": input_ids, "attention_mask": attention_mask, "cu_lengths": torch.tensor(cu_lengths)}


def ranking_loss(rewards, cu_lengths, beta):
    losses = []
    for start, end in zip(cu_lengths[:-1].tolist(), cu_lengths[1:].tolist()):
        pairs = torch.combinations(torch.arange(end - start, device=rewards.device), 2)
        pos = rewards[start + pairs[:, 0]]
        neg = rewards[start + pairs[:, 1]]
        l2 = 0.5 * (pos ** 2 + neg ** 2)
        losses.append((-F.logsigmoid(pos - neg) + beta * l2).mean())
    return torch.stack(losses).mean()


def main():
    cfg = CONFIG
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=cfg["gradient_accumulation_steps"])
    set_seed(cfg["seed"])
    rng = random.Random(cfg["seed"])

    rows = make_comparisons(cfg["num_rows"], rng)
    train_ds = WebGPTComparisons(rows, cfg["max_answers"])
    tokenizer = WordTokenizer([r["question"] for r in rows] + [a for ans in train_ds.answers for a in ans])
    loader = DataLoader(
        train_ds, batch_size=cfg["batch_size"], shuffle=True,
        collate_fn=RankingCollator(tokenizer, cfg["max_length"]),
    )

    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=64, n_embd=64, n_layer=2, n_head=4,
        num_labels=1, pad_token_id=tokenizer.pad_id, bos_token_id=tokenizer.sep_id, eos_token_id=tokenizer.sep_id,
    )
    model = GPT2ForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["learning_rate"], weight_decay=0.0)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    step = 0
    for epoch in range(cfg["num_epochs"]):
        model.train()
        for batch in loader:
            with accelerator.accumulate(model):
                rewards = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.squeeze(-1)
                loss = ranking_loss(rewards, batch["cu_lengths"], cfg["beta"])
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
            step += 1
            accelerator.print(f"epoch {epoch} step {step:3d}  ranking loss {loss.item():.4f}")

    accelerator.print("done")


if __name__ == "__main__":
    main()
