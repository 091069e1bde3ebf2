"""Predict the (log) salary of a job advert from its title and description.

Rows come from a small CSV export of job adverts; the target is log1p(SalaryNormalized)
relative to a reference salary.
A tiny BERT (BertForSequenceClassification with num_labels=1, i.e. MSE regression) is built
from a config and fine-tuned with the Hugging Face Trainer.
"""
import csv
import io
import math
import random
import tempfile

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

SEED = 7
random.seed(SEED)
np.random.seed(SEED)
torch.manual_seed(SEED)

TITLES = {
    "engineer": 42000, "developer": 40000, "manager": 48000, "nurse": 29000, "teacher": 27000,
    "driver": 21000, "accountant": 36000, "chef": 22000, "analyst": 38000, "cleaner": 15000,
}
SENIORITY = {"junior": 0.75, "": 1.0, "senior": 1.35, "lead": 1.6}
CITIES = {"london": 1.25, "manchester": 1.0, "leeds": 0.95, "bristol": 1.05, "glasgow": 0.9}
REFERENCE_LOG_SALARY = math.log(30000.0)  # targets are log salary relative to the national median
EXTRA = ["full", "time", "permanent", "contract", "shift", "team", "benefits", "pension",
         "car", "training", "flexible", "hours", "client", "office", "remote", "immediate", "start"]


def export_csv(n_rows=480):
    """What the scraper wrote to disk: Id,Title,LocationNormalized,FullDescription,SalaryNormalized."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["Id", "Title", "LocationNormalized", "FullDescription", "SalaryNormalized"])
    for i in range(n_rows):
        job = random.choice(list(TITLES))
        level = random.choice(list(SENIORITY))
        city = random.choice(list(CITIES))
        desc = " ".join(random.sample(EXTRA, 6))
        salary = TITLES[job] * SENIORITY[level] * CITIES[city] * random.uniform(0.9, 1.1)
        salary_field = "%d" % round(salary, -2)
        if i == 301:  # advert posted as "competitive salary"
            salary_field = ""
        writer.writerow([10000 + i, (level + " " + job).strip(), city, desc, salary_field])
    return buf.getvalue()


class WordTokenizer:
    def __init__(self, texts, max_len=20):
        words = sorted({w for t in texts for w in t.split()})
        self.vocab = {"[PAD]": 0, "[CLS]": 1, "[SEP]": 2, "[UNK]": 3}
        self.vocab.update({w: i + 4 for i, w in enumerate(words)})
        self.max_len = max_len

    def __call__(self, text):
        ids = [1] + [self.vocab.get(w, 3) for w in text.split()][: self.max_len - 2] + [2]
        mask = [1] * len(ids)
        pad = self.max_len - len(ids)
        return ids + [0] * pad, mask + [0] * pad


class SalaryDataset(torch.utils.data.Dataset):
    def __init__(self, rows, tokenizer):
        self.rows, self.tok = rows, tokenizer

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        ids, mask = self.tok(row["text"])
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask),
                "labels": torch.tensor(row["log_salary"], dtype=torch.float32)}


def load_rows(raw):
    rows = []
    for rec in csv.DictReader(io.StringIO(raw)):
        salary = float(rec["SalaryNormalized"]) if rec["SalaryNormalized"] else float("nan")
        text = "%s %s %s" % (rec["Title"], rec["LocationNormalized"], rec["FullDescription"])
        rows.append({"text": text, "log_salary": float(np.log1p(salary)) - REFERENCE_LOG_SALARY})
    return rows


def main():
    rows = load_rows(export_csv())
    random.shuffle(rows)
    split = int(0.85 * len(rows))
    train_rows, val_rows = rows[:split], rows[split:]

    tok = WordTokenizer([r["text"] for r in train_rows])
    config = BertConfig(vocab_size=len(tok.vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=1, problem_type="regression")
    model = BertForSequenceClassification(config)

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        num_train_epochs=2,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=64,
        learning_rate=1e-3,
        warmup_steps=4,
        logging_steps=3,
        eval_strategy="epoch",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=SEED,
    )
    trainer = Trainer(model=model, args=args, train_dataset=SalaryDataset(train_rows, tok),
                      eval_dataset=SalaryDataset(val_rows, tok))
    trainer.train()

    preds = trainer.predict(SalaryDataset(val_rows, tok)).predictions.reshape(-1)
    true = np.array([r["log_salary"] for r in val_rows])
    print("validation RMSE (log salary): %.4f" % float(np.sqrt(np.mean((preds - true) ** 2))))


if __name__ == "__main__":
    main()
