"""SASRec-style next-item recommender written as a PreTrainedModel and trained with the HF Trainer.

Shop sessions are turned into (history -> next item) examples.  The history of an example is
every earlier purchase of the same customer inside a 30-day window (at most 20 items,
left-padded with item id 0), and a ReChorus-style transformer encodes it: multi-head
self-attention whose padded keys are filled with -inf before the softmax, the most recent
position is taken as the user vector and scored against all item embeddings.

Most customers buy every few days, but a handful come back after a break of months: their
30-day window is empty and the example is all padding.  For such a row every attention
score is -inf, softmax computes 0/0 and the whole sequence becomes NaN; the batch that holds
one returns a nan loss, the backward pass writes NaN into every gradient and AdamW copies it
into the weights, so every later logged loss is nan.

Reproduces: https://github.com/THUwangcy/ReChorus/issues/8 ("masked_fill with '-np.inf' will
cause 'nan'" when all the input vector is masked).  Fixed in ReChorus commit 3499e22 by
zeroing the NaN attention weights right after the softmax:
scores = scores.masked_fill(torch.isnan(scores), 0).
"""
import tempfile

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import Dataset
from transformers import PretrainedConfig, PreTrainedModel, Trainer, TrainingArguments

N_GENRES, ITEMS_PER_GENRE = 6, 25
WINDOW_DAYS = 30.0


class SeqRecConfig(PretrainedConfig):
    model_type = "toy_sasrec"

    def __init__(self, item_num=151, emb_size=32, num_heads=2, num_layers=2, history_max=20,
                 dropout=0.1, **kwargs):
        super().__init__(**kwargs)
        self.item_num = item_num
        self.emb_size = emb_size
        self.num_heads = num_heads
        self.num_layers = num_layers
        self.history_max = history_max
        self.dropout = dropout


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.h = n_heads
        self.d_k = d_model // n_heads
        self.q_linear = nn.Linear(d_model, d_model)
        self.k_linear = nn.Linear(d_model, d_model)
        self.v_linear = nn.Linear(d_model, d_model)

    def head_split(self, x):  # bs, seq_len, d -> bs, h, seq_len, d_k
        return x.view(*x.shape[:-1], self.h, self.d_k).transpose(-2, -3)

    def forward(self, q, k, v, mask=None):
        origin_shape = q.shape
        q = self.head_split(self.q_linear(q))
        k = self.head_split(self.k_linear(k))
        v = self.head_split(self.v_linear(v))
        output = self.scaled_dot_product_attention(q, k, v, self.d_k, mask)
        return output.transpose(-2, -3).reshape(origin_shape)

    @staticmethod
    def scaled_dot_product_attention(q, k, v, d_k, mask=None):
        scores = torch.matmul(q, k.transpose(-2, -1)) / d_k ** 0.5  # bs, head, q_len, k_len
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -np.inf)
        scores = scores.softmax(dim=-1)
        return torch.matmul(scores, v)


class TransformerLayer(nn.Module):
    def __init__(self, d_model, d_ff, n_heads, dropout):
        super().__init__()
        self.masked_attn_head = MultiHeadAttention(d_model, n_heads)
        self.layer_norm1 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.layer_norm2 = nn.LayerNorm(d_model)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, seq, mask=None):
        context = self.masked_attn_head(seq, seq, seq, mask)
        context = self.layer_norm1(self.dropout1(context) + seq)
        output = self.linear2(self.linear1(context).relu())
        return self.layer_norm2(self.dropout2(output) + context)


class SASRecForNextItem(PreTrainedModel):
    config_class = SeqRecConfig
    base_model_prefix = "sasrec"

    def __init__(self, config):
        super().__init__(config)
        self.i_embeddings = nn.Embedding(config.item_num, config.emb_size, padding_idx=0)
        self.p_embeddings = nn.Embedding(config.history_max + 1, config.emb_size)
        self.blocks = nn.ModuleList([
            TransformerLayer(config.emb_size, config.emb_size, config.num_heads, config.dropout)
            for _ in range(config.num_layers)])
        self.register_buffer("len_range", torch.arange(config.history_max), persistent=False)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.05)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, history, labels=None):
        batch_size, seq_len = history.shape
        valid_his = (history > 0).long()
        his_vectors = self.i_embeddings(history)
        # left padded: [[0, a, b, c], [0, 0, 0, d]] -> position [[0, 3, 2, 1], [0, 0, 0, 1]] (1 = most recent)
        position = (seq_len - self.len_range[None, :seq_len]) * valid_his
        his_vectors = his_vectors + self.p_embeddings(position)

        attn_mask = valid_his.view(batch_size, 1, 1, seq_len)
        for block in self.blocks:
            his_vectors = block(his_vectors, attn_mask)
        his_vectors = his_vectors * valid_his[:, :, None].float()
        his_vector = (his_vectors * (position == 1).float()[:, :, None]).sum(1)

        logits = his_vector @ self.i_embeddings.weight.t()
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


def simulate_purchases(rng, n_users=450, long_break_p=0.0016):
    """Per customer: a favourite genre, items that tend to follow each other, purchase days."""
    users = []
    for _ in range(n_users):
        genre = rng.integers(N_GENRES)
        n = rng.integers(8, 21)
        item = 1 + genre * ITEMS_PER_GENRE + rng.integers(ITEMS_PER_GENRE)
        day, seq = 0.0, []
        for _ in range(n):
            seq.append((int(item), day))
            r = rng.random()
            base = 1 + genre * ITEMS_PER_GENRE
            if r < 0.7:
                item = base + (item - base + 1) % ITEMS_PER_GENRE
            elif r < 0.95:
                item = base + rng.integers(ITEMS_PER_GENRE)
            else:
                item = 1 + rng.integers(N_GENRES * ITEMS_PER_GENRE)
            gap = rng.exponential(2.5)
            if rng.random() < long_break_p:
                gap += rng.uniform(45, 150)   # customer comes back after months
            day += gap
        users.append(seq)
    return users


class NextItemDataset(Dataset):
    def __init__(self, users, history_max):
        self.rows = []
        for seq in users:
            for t in range(1, len(seq)):
                item, day = seq[t]
                his = [i for i, d in seq[:t] if day - d <= WINDOW_DAYS][-history_max:]
                padded = [0] * (history_max - len(his)) + his
                self.rows.append((padded, item))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, idx):
        his, item = self.rows[idx]
        return {"history": torch.tensor(his), "labels": torch.tensor(item)}


def main():
    torch.set_num_threads(1)
    rng = np.random.default_rng(9)
    config = SeqRecConfig(item_num=N_GENRES * ITEMS_PER_GENRE + 1)
    train_ds = NextItemDataset(simulate_purchases(rng), config.history_max)
    val_ds = NextItemDataset(simulate_purchases(rng, n_users=60, long_break_p=0.0), config.history_max)
    n_empty = sum(1 for his, _ in train_ds.rows if not any(his))
    print(f"train examples {len(train_ds)} (empty 30-day history: {n_empty}), val {len(val_ds)}")

    torch.manual_seed(0)
    model = SASRecForNextItem(config)
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="sasrec_"),
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        eval_strategy="epoch",
        num_train_epochs=2,
        per_device_train_batch_size=32,
        per_device_eval_batch_size=128,
        learning_rate=2e-3,
        weight_decay=0.01,
        warmup_steps=20,
        logging_steps=10,
        logging_nan_inf_filter=False,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=val_ds)
    trainer.train()


if __name__ == "__main__":
    main()
