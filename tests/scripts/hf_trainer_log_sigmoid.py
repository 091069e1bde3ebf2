"""Fine-tune a tiny BERT for binary classification with the Hugging Face Trainer and a
hand-written binary cross-entropy (random token ids, nothing downloaded)."""

import tempfile

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Pairs(torch.utils.data.Dataset):
    def __init__(self, n=256, length=16, vocab=100):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, length), generator=g)
        self.labels = (self.ids[:, 0] > vocab // 2).float()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class BinaryTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        labels = inputs.pop("labels")
        logits = model(**inputs).logits[:, 0] * 1000.0
        p = torch.sigmoid(logits)
        loss = -(labels * torch.log(p) + (1 - labels) * torch.log(1 - p)).mean()
        return (loss, logits) if return_outputs else loss


def main():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=1,
    )
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=16,
        num_train_epochs=4,
        learning_rate=1e-3,
        logging_steps=4,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
    )
    trainer = BinaryTrainer(model=model, args=args, train_dataset=Pairs())
    trainer.train()
    print([entry.get("loss") for entry in trainer.state.log_history])


if __name__ == "__main__":
    main()
