"""Review sentiment classifier: a small DistilBERT-style encoder written as a PreTrainedModel.

Reviews are cleaned (URLs, @handles and emoji codes removed), tokenised with a word-level
vocabulary built from the training set and padded to a fixed length; the model is trained
with the Hugging Face Trainer.
"""
import math
import random
import re
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments
from transformers.modeling_outputs import SequenceClassifierOutput

torch.manual_seed(0)
random.seed(0)

MAX_LEN = 24
POS_WORDS = ["great", "love", "excellent", "perfect", "happy", "recommend", "amazing", "works"]
NEG_WORDS = ["bad", "broken", "refund", "terrible", "awful", "disappointed", "waste", "returned"]
FILLER = ["the", "product", "arrived", "it", "was", "and", "i", "this", "after", "day", "box", "very"]


class DistilConfig(PretrainedConfig):
    model_type = "tiny_distil"

    def __init__(self, vocab_size=64, dim=48, n_layers=2, n_heads=4, hidden_dim=96,
                 max_position_embeddings=64, num_labels=2, dropout=0.1, **kwargs):
        super().__init__(num_labels=num_labels, **kwargs)
        self.vocab_size = vocab_size
        self.dim = dim
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.hidden_dim = hidden_dim
        self.max_position_embeddings = max_position_embeddings
        self.dropout = dropout


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_heads = config.n_heads
        self.dim = config.dim
        self.q_lin = nn.Linear(config.dim, config.dim)
        self.k_lin = nn.Linear(config.dim, config.dim)
        self.v_lin = nn.Linear(config.dim, config.dim)
        self.out_lin = nn.Linear(config.dim, config.dim)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, mask):
        bs, q_length, dim = x.size()
        dim_per_head = self.dim // self.n_heads

        def shape(t):
            return t.view(bs, -1, self.n_heads, dim_per_head).transpose(1, 2)

        q = shape(self.q_lin(x)) / math.sqrt(dim_per_head)
        k = shape(self.k_lin(x))
        v = shape(self.v_lin(x))
        scores = torch.matmul(q, k.transpose(2, 3))
        mask = (mask == 0).view(bs, 1, 1, -1).expand_as(scores)
        scores = scores.masked_fill(mask, -float("inf"))
        weights = self.dropout(F.softmax(scores, dim=-1))
        context = torch.matmul(weights, v).transpose(1, 2).reshape(bs, -1, self.dim)
        return self.out_lin(context)


class TransformerBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = MultiHeadSelfAttention(config)
        self.sa_layer_norm = nn.LayerNorm(config.dim, eps=1e-12)
        self.ffn = nn.Sequential(nn.Linear(config.dim, config.hidden_dim), nn.GELU(),
                                 nn.Linear(config.hidden_dim, config.dim), nn.Dropout(config.dropout))
        self.output_layer_norm = nn.LayerNorm(config.dim, eps=1e-12)

    def forward(self, x, attn_mask):
        x = self.sa_layer_norm(self.attention(x, attn_mask) + x)
        return self.output_layer_norm(self.ffn(x) + x)


class DistilForSequenceClassification(PreTrainedModel):
    config_class = DistilConfig

    def __init__(self, config):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.dim, padding_idx=0)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.dim)
        self.emb_norm = nn.LayerNorm(config.dim, eps=1e-12)
        self.layers = nn.ModuleList([TransformerBlock(config) for _ in range(config.n_layers)])
        self.pre_classifier = nn.Linear(config.dim, config.dim)
        self.classifier = nn.Linear(config.dim, config.num_labels)
        self.dropout = nn.Dropout(config.dropout)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()
        if isinstance(module, nn.LayerNorm):
            module.weight.data.fill_(1.0)
            module.bias.data.zero_()

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        positions = torch.arange(input_ids.size(1), device=input_ids.device)
        hidden = self.emb_norm(self.word_embeddings(input_ids) + self.position_embeddings(positions))
        for layer in self.layers:
            hidden = layer(hidden, attention_mask)
        pooled = self.dropout(F.relu(self.pre_classifier(hidden[:, 0])))
        logits = self.classifier(pooled)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


def make_reviews(n):
    reviews = []
    for i in range(n):
        label = i % 2
        words = random.sample(FILLER, 4) + random.sample(POS_WORDS if label else NEG_WORDS, 2)
        random.shuffle(words)
        text = " ".join(words)
        if random.random() < 0.3:
            text += " see https://shop.example.com/item/%d" % random.randint(100, 999)
        if random.random() < 0.2:
            text = "@seller%d " % random.randint(1, 50) + text
        reviews.append((text, label))
    # a few reviews that consist of a link or an emoji code only
    reviews[37] = ("https://imgur.example.com/a/xk2Lq", 1)
    reviews[141] = (":thumbs_up: :thumbs_up:", 1)
    return reviews


def clean(text):
    text = re.sub(r"https?://\S+", " ", text)
    text = re.sub(r"@\w+", " ", text)
    text = re.sub(r":[a-z_]+:", " ", text)
    return text.lower().split()


class ReviewDataset(Dataset):
    def __init__(self, reviews, vocab):
        self.items = []
        for text, label in reviews:
            ids = [vocab.get(w, 1) for w in clean(text)][:MAX_LEN]
            mask = [1] * len(ids) + [0] * (MAX_LEN - len(ids))
            ids = ids + [0] * (MAX_LEN - len(ids))
            self.items.append({"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask),
                               "labels": torch.tensor(label)})

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        return self.items[idx]


def main():
    reviews = make_reviews(320)
    words = sorted({w for text, _ in reviews for w in clean(text)})
    vocab = {w: i + 2 for i, w in enumerate(words)}  # 0 = pad, 1 = unk
    train_ds = ReviewDataset(reviews[:256], vocab)
    eval_ds = ReviewDataset(reviews[256:], vocab)

    config = DistilConfig(vocab_size=len(vocab) + 2)
    model = DistilForSequenceClassification(config)

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        num_train_epochs=3,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=32,
        learning_rate=5e-4,
        warmup_steps=5,
        weight_decay=0.01,
        logging_steps=2,
        logging_nan_inf_filter=False,
        eval_strategy="epoch",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )

    def accuracy(pred):
        return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}

    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                      compute_metrics=accuracy)
    trainer.train()


if __name__ == "__main__":
    main()
