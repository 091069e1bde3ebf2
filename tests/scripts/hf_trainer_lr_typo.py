"""Fine-tune a tiny BERT for sentence classification with the Hugging Face Trainer (random token
ids, nothing downloaded). The learning rate in TrainingArguments is a typo: 2e5 for 2e-5."""

import tempfile

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Sentences(torch.utils.data.Dataset):
    def __init__(self, n=256, length=16, vocab=100):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, length), generator=g)
        self.labels = self.ids[:, :4].float().mean(1) / vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


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
        num_train_epochs=2,
        learning_rate=2e5,
        weight_decay=0.01,
        logging_steps=4,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Sentences())
    trainer.train()
    print([entry.get("loss") for entry in trainer.state.log_history])


if __name__ == "__main__":
    main()
