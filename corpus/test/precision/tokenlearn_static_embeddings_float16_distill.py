"""Tokenlearn-style pre-training of a static (model2vec) embedding model on the mean
token embeddings of a teacher, with the distilled embedding table kept in float16.

Setting: the tokenlearn layout in one file -- a featurize step (the teacher's mean
output vector per text), a ``distill()`` that builds the static model (per-token teacher
vectors, PCA, Zipf weighting, quantisation, like model2vec's distill), and
``train_supervised`` from tokenlearn/pretrain.py: StaticModelFineTuner (nn.Embedding
initialised from the static vectors, learnable per-token weights, linear head),
TextDataset with a collate_fn, Adam with two parameter groups, cosine + mse loss,
ReduceLROnPlateau, logging per epoch.  Everything runs on the CPU; the data and the
"teacher" are synthetic.

Bug (precision): model2vec's distill quantises the vectors to float16 by default, and
train_supervised builds the trainable nn.Embedding straight from
``torch.from_numpy(model.embedding)``, so the embedding table is a float16 parameter
updated by Adam in float16.  Adam's eps (1e-8) is 0 in float16 and the second moment
(1 - beta2) * grad**2 of the small per-token gradients underflows to 0, so the first
step divides by zero: rows that were not in the first batch get 0/0 = NaN and the
others +-inf.  The second batch already looks up those rows and the loss is nan from
then on ("Training loss is always NaN during training").

Fix (maintainer's answer in the thread, merged in tokenlearn PR #23, whose train.py
calls distill(model_name=..., quantize_to="float32", ...)): distill with
quantize_to="float32" so that the embeddings are trained in float32.

Report: https://github.com/MinishLab/tokenlearn/issues/22
"""
from __future__ import annotations

import argparse
import logging
import sys

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s")
logger = logging.getLogger("tokenlearn")

torch.manual_seed(0)
np.random.seed(0)

# ------------------------------------------------------------------ synthetic corpus / teacher
WORDS = ["[PAD]", "[UNK]"] + [f"w{i}" for i in range(600)]
TEACHER_DIM = 96


class Encoding:
    def __init__(self, ids):
        self.ids = ids


class WordTokenizer:
    def __init__(self, vocab):
        self.vocab = {w: i for i, w in enumerate(vocab)}

    def token_to_id(self, token):
        return self.vocab[token]

    def encode_batch_fast(self, texts, add_special_tokens=False):
        return [Encoding([self.vocab.get(w, 1) for w in t.split()]) for t in texts]


def make_corpus(n_texts, rng):
    # Zipf-like word frequencies, texts of 6-30 words
    p = 1.0 / np.arange(1, len(WORDS) - 1) ** 1.1
    p /= p.sum()
    return [" ".join(rng.choice(WORDS[2:], size=rng.randint(6, 30), p=p)) for _ in range(n_texts)]


TEACHER_TOKENS = np.random.RandomState(1).randn(len(WORDS), TEACHER_DIM).astype(np.float32)


def featurize(texts, tokenizer):
    """Mean of the teacher's token embeddings for every text (the tokenlearn targets)."""
    out = []
    for enc in tokenizer.encode_batch_fast(texts):
        out.append(np.tanh(TEACHER_TOKENS[enc.ids]).mean(axis=0))
    return np.stack(out)


class StaticModel:
    def __init__(self, vectors, tokenizer, config=None):
        self.embedding = vectors
        self.tokenizer = tokenizer
        self.config = config or {}


def distill(model_name, vocabulary=None, pca_dims=64, quantize_to="float16"):
    """model2vec-like distillation: embed every token with the teacher, PCA, Zipf weight, quantize."""
    tokenizer = WordTokenizer(vocabulary or WORDS)
    emb = np.tanh(TEACHER_TOKENS)
    emb = emb - emb.mean(axis=0)
    _, _, vt = np.linalg.svd(emb, full_matrices=False)
    emb = emb @ vt[:pca_dims].T
    emb = emb * np.log(1 + np.arange(len(emb)))[:, None] / np.log(len(emb))
    emb[0] = 0.0
    return StaticModel(vectors=emb.astype(quantize_to), tokenizer=tokenizer, config={"model_name": model_name})


# ------------------------------------------------------------------ tokenlearn/pretrain.py
class StaticModelFineTuner(nn.Module):
    def __init__(self, vectors: torch.Tensor, out_dim: int, pad_id: int) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.embeddings = nn.Embedding.from_pretrained(vectors.clone(), freeze=False, padding_idx=pad_id)
        self.n_out = out_dim
        self.out_layer = nn.Linear(vectors.shape[1], self.n_out)
        weights = torch.ones(len(vectors))
        weights[pad_id] = 0
        self.w = nn.Parameter(weights)

    def sub_forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w[x]
        zeros = (x != self.pad_id).float()
        length = zeros.sum(1)
        embedded = self.embeddings(x)
        embedded = embedded * zeros[:, :, None]
        embedded = (embedded * w[:, :, None]).sum(1) / w.sum(1)[:, None]
        embedded = embedded / length[:, None]
        return embedded

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embedded = self.sub_forward(x)
        return self.out_layer(embedded), embedded


class TextDataset(Dataset):
    def __init__(self, texts: list[str], targets: torch.Tensor, tokenizer) -> None:
        if len(targets) != len(texts):
            raise ValueError("Number of labels does not match number of texts.")
        self.texts = texts
        self.tokenized_texts = [e.ids for e in tokenizer.encode_batch_fast(self.texts, add_special_tokens=False)]
        self.targets = targets

    def __len__(self) -> int:
        return len(self.tokenized_texts)

    def __getitem__(self, index: int):
        return self.tokenized_texts[index], self.targets[index]

    @staticmethod
    def collate_fn(batch):
        texts, targets = zip(*batch)
        tensors = [torch.LongTensor(x).int() for x in texts]
        return pad_sequence(tensors, batch_first=True, padding_value=0), torch.stack(targets)

    def to_dataloader(self, shuffle: bool, batch_size: int = 32) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        return DataLoader(self, collate_fn=self.collate_fn, shuffle=shuffle, batch_size=batch_size, generator=g)


def train_supervised(train_dataset, model, max_epochs=6, batch_size=64, cosine_weight=1.0, mse_weight=1.0,
                     lr_model=0.003, lr_linear=0.01):
    train_dataloader = train_dataset.to_dataloader(shuffle=True, batch_size=batch_size)
    trainable_model = StaticModelFineTuner(
        torch.from_numpy(model.embedding),
        out_dim=train_dataset.targets.shape[1],
        pad_id=model.tokenizer.token_to_id("[PAD]"),
    )
    model_params = list(trainable_model.embeddings.parameters()) + [trainable_model.w]
    linear_params = trainable_model.out_layer.parameters()
    optimizer = torch.optim.Adam([{"params": model_params, "lr": lr_model}, {"params": linear_params, "lr": lr_linear}])
    criterion = nn.CosineSimilarity()
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=3, min_lr=1e-6)

    for epoch in range(max_epochs):
        logger.info(f"Epoch {epoch}")
        trainable_model.train()
        train_losses, cosine_losses, mse_losses = [], [], []
        for step, (x, y) in enumerate(train_dataloader):
            optimizer.zero_grad()
            y_hat, emb = trainable_model(x)
            cosine_loss = 1 - criterion(y_hat, y).mean()
            mse_loss = (emb ** 2).mean()
            total_loss = cosine_weight * cosine_loss + mse_weight * mse_loss
            total_loss.backward()
            optimizer.step()
            train_losses.append(total_loss.item())
            cosine_losses.append(cosine_loss.item())
            mse_losses.append(mse_loss.item())
            if epoch == 0 and step < 4:
                logger.info(f"step {step} loss {total_loss.item():.4f}")
        avg_train_loss = np.mean(train_losses)
        scheduler.step(avg_train_loss)
        logger.info(f"Training loss: {avg_train_loss:.3f}")
        logger.info(f"Cosine loss: {np.mean(cosine_losses):.3f}")
        logger.info(f"MSE loss: {np.mean(mse_losses):.3f}")

    trainable_model.eval()
    with torch.no_grad():
        vectors = trainable_model.sub_forward(torch.arange(len(trainable_model.embeddings.weight))[:, None])
    return StaticModel(vectors=vectors.numpy(), tokenizer=model.tokenizer, config=model.config), trainable_model


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a Model2Vec using tokenlearn.")
    parser.add_argument("--model-name", type=str, default="synthetic/teacher-base")
    parser.add_argument("--n-texts", type=int, default=1024)
    parser.add_argument("--pca-dims", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()

    rng = np.random.RandomState(0)
    texts = make_corpus(args.n_texts, rng)
    model = distill(model_name=args.model_name, pca_dims=args.pca_dims)
    vecs = featurize(texts, model.tokenizer)
    # reduce the targets to the model's dimensionality, as tokenlearn does with PCA
    vecs = vecs - vecs.mean(axis=0)
    _, _, vt = np.linalg.svd(vecs, full_matrices=False)
    train_vec = (vecs @ vt[:args.pca_dims].T).astype(np.float32)

    train_data = TextDataset(texts, torch.from_numpy(train_vec), model.tokenizer)
    new_model, _ = train_supervised(train_data, model, max_epochs=args.epochs)
    logger.info(f"Trained static model: {new_model.embedding.shape[0]} tokens x {new_model.embedding.shape[1]} dims")


if __name__ == "__main__":
    main()
