"""BiLSTM part-of-speech tagger on a synthetic treebank with padded batches.

Sentences have different lengths; the collate function pads token ids with 0 and tag
ids with -100 so that nn.CrossEntropyLoss(ignore_index=-100) skips padding.  The
first sub-token of some words is also labelled -100 (word-piece style).
"""
import random

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

PAD, IGNORE = 0, -100
TAGS = ["DET", "NOUN", "VERB", "ADJ", "ADP", "PRON", "ADV", "PUNCT"]

random.seed(0)
torch.manual_seed(0)

LEXICON = {
    "DET": ["the", "a", "this", "every"], "NOUN": ["cat", "dog", "model", "river", "idea", "city"],
    "VERB": ["runs", "sees", "trains", "likes", "finds"], "ADJ": ["red", "quick", "small", "deep"],
    "ADP": ["on", "in", "under", "near"], "PRON": ["she", "they", "it"], "ADV": ["quickly", "often", "rarely"],
    "PUNCT": [".", "!"],
}
TEMPLATES = [
    ["DET", "NOUN", "VERB", "DET", "ADJ", "NOUN", "PUNCT"],
    ["PRON", "VERB", "ADV", "PUNCT"],
    ["DET", "ADJ", "NOUN", "VERB", "ADP", "DET", "NOUN", "PUNCT"],
    ["PRON", "ADV", "VERB", "DET", "NOUN", "ADP", "DET", "ADJ", "ADJ", "NOUN", "PUNCT"],
    ["NOUN", "VERB", "PUNCT"],
]
VOCAB = {"<pad>": PAD, "<unk>": 1}
for words in LEXICON.values():
    for w in words:
        VOCAB.setdefault(w, len(VOCAB))
VOCAB.update({"##s": len(VOCAB)})


def make_corpus(n):
    corpus = []
    for _ in range(n):
        tags = random.choice(TEMPLATES)
        tokens, labels = [], []
        for t in tags:
            w = random.choice(LEXICON[t])
            if t == "NOUN" and random.random() < 0.3:
                tokens += [VOCAB[w], VOCAB["##s"]]
                labels += [TAGS.index(t), IGNORE]
            else:
                tokens.append(VOCAB[w])
                labels.append(TAGS.index(t))
        corpus.append((torch.tensor(tokens), torch.tensor(labels)))
    return corpus


def collate(batch):
    toks, labs = zip(*batch)
    lengths = torch.tensor([len(t) for t in toks])
    toks = nn.utils.rnn.pad_sequence(toks, batch_first=True, padding_value=PAD)
    labs = nn.utils.rnn.pad_sequence(labs, batch_first=True, padding_value=IGNORE)
    return toks, lengths, labs


class BiLSTMTagger(nn.Module):
    def __init__(self, vocab_size, n_tags, emb=48, hidden=64):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, emb, padding_idx=PAD)
        self.lstm = nn.LSTM(emb, hidden, batch_first=True, bidirectional=True)
        self.drop = nn.Dropout(0.3)
        self.out = nn.Linear(2 * hidden, n_tags)

    def forward(self, toks, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(self.emb(toks), lengths, batch_first=True,
                                                   enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=toks.shape[1])
        return self.out(self.drop(out))


def accuracy(logits, labels):
    keep = labels != IGNORE
    return (logits.argmax(-1)[keep] == labels[keep]).float().mean().item()


def main():
    train_loader = DataLoader(make_corpus(1200), batch_size=32, shuffle=True, collate_fn=collate)
    dev = collate(make_corpus(200))
    model = BiLSTMTagger(len(VOCAB), len(TAGS))
    criterion = nn.CrossEntropyLoss(ignore_index=IGNORE)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    for epoch in range(6):
        model.train()
        for step, (toks, lengths, labs) in enumerate(train_loader):
            logits = model(toks, lengths)
            loss = criterion(logits.reshape(-1, len(TAGS)), labs.reshape(-1))
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step:3d} loss {loss.item():.4f} acc {accuracy(logits, labs):.3f}")
        model.eval()
        with torch.no_grad():
            logits = model(dev[0], dev[1])
            dev_loss = criterion(logits.reshape(-1, len(TAGS)), dev[2].reshape(-1)).item()
        print(f"epoch {epoch} dev_loss {dev_loss:.4f} dev_acc {accuracy(logits, dev[2]):.3f}")


if __name__ == "__main__":
    main()
