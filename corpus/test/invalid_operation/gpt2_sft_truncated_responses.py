"""Supervised fine-tuning of a tiny GPT-2 on prompt/response pairs with the HF Trainer.

Only the response tokens are supervised: prompt tokens get the label -100.  Examples are
tokenised with a word-level vocabulary, truncated to MAX_LENGTH tokens and padded by the
collator.  Some prompts paste a whole support ticket before the question.
"""
import random
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

random.seed(1)
torch.manual_seed(1)

MAX_LENGTH = 32
TOPICS = ["invoice", "password", "delivery", "refund", "account", "printer", "upgrade", "login"]
ANSWERS = {
    "invoice": "open billing then download the invoice as pdf",
    "password": "use the reset link we sent to your email",
    "delivery": "your parcel ships within two working days",
    "refund": "refunds reach your card within five days",
    "account": "go to settings and choose close account",
    "printer": "reinstall the driver and restart the printer",
    "upgrade": "pick a plan on the pricing page to upgrade",
    "login": "clear cookies and try to log in again",
}
FILLER = ("hello team i have been a customer for years and today something strange happened "
          "with my order and the app kept showing a spinning wheel while i was waiting").split()


def make_example():
    topic = random.choice(TOPICS)
    prompt = "user : how do i fix my %s issue ? assistant :" % topic
    if random.random() < 0.2:
        ticket = " ".join(random.choice(FILLER) for _ in range(random.randint(30, 45)))
        prompt = "user : " + ticket + " . " + prompt[len("user : "):]
    return {"prompt": prompt, "response": ANSWERS[topic] + " <eos>"}


class WordTokenizer:
    def __init__(self, texts):
        words = sorted({w for t in texts for w in t.split()})
        self.vocab = {"<pad>": 0, **{w: i + 1 for i, w in enumerate(words)}}

    def encode(self, text):
        return [self.vocab[w] for w in text.split()]


def tokenize(example, tok):
    prompt_ids = tok.encode(example["prompt"])
    response_ids = tok.encode(example["response"])
    input_ids = (prompt_ids + response_ids)[:MAX_LENGTH]
    labels = ([-100] * len(prompt_ids) + response_ids)[:MAX_LENGTH]
    return {"input_ids": input_ids, "labels": labels}


def collate(batch):
    width = max(len(ex["input_ids"]) for ex in batch)
    input_ids = torch.zeros(len(batch), width, dtype=torch.long)
    attention_mask = torch.zeros(len(batch), width, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for i, ex in enumerate(batch):
        n = len(ex["input_ids"])
        input_ids[i, :n] = torch.tensor(ex["input_ids"])
        attention_mask[i, :n] = 1
        labels[i, :n] = torch.tensor(ex["labels"])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def main():
    raw = [make_example() for _ in range(192)]
    tok = WordTokenizer([ex["prompt"] + " " + ex["response"] for ex in raw])
    train = [tokenize(ex, tok) for ex in raw]

    config = GPT2Config(vocab_size=len(tok.vocab), n_positions=MAX_LENGTH, n_embd=48, n_layer=2, n_head=4,
                        loss_type="ForCausalLM")
    model = GPT2LMHeadModel(config)

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        num_train_epochs=1,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        warmup_steps=5,
        logging_steps=1,
        logging_nan_inf_filter=False,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
        seed=1,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train, data_collator=collate)
    result = trainer.train()
    print("final training loss:", result.training_loss)


if __name__ == "__main__":
    main()
