"""
Classifying surnames by language with a character-level RNN (in the style of the
PyTorch "NLP From Scratch: Classifying Names with a Character-Level RNN" tutorial).

Bug: the tutorial RNN has no non-linearity on the recurrent path (hidden = i2h(cat(x, h)))
and is trained one name at a time with a plain SGD update and no gradient clipping.  As
training goes on the recurrent weights grow, the hidden state is multiplied by them once per
character, and on a long name the gradient explodes; the loss then turns into nan (the
rendered tutorial showed nan from iteration 35000 on).

Report: https://github.com/pytorch/tutorials/issues/847
Fix: clip the gradient norm before the update, as the rewritten tutorial does
(nn.utils.clip_grad_norm_(rnn.parameters(), 3)).
"""
import math
import random
import string
import time

import torch
import torch.nn as nn

torch.manual_seed(0)
random.seed(0)

all_letters = string.ascii_letters + " .,;'"
n_letters = len(all_letters)

# ---- a small synthetic stand-in for data/names/*.txt --------------------------------------
syllables = {
    "English": ["son", "ton", "well", "ham", "ley", "wood", "er", "smith", "ford"],
    "Russian": ["ov", "ev", "sky", "in", "enko", "ich", "ak", "ash", "kin"],
    "Italian": ["ini", "etti", "one", "ano", "elli", "ucci", "aro", "esi", "o"],
    "Japanese": ["ka", "mo", "to", "ya", "shi", "na", "ta", "ki", "uchi"],
    "Arabic": ["al", "ab", "ha", "eed", "oud", "sa", "ir", "kh", "an"],
    "Polish": ["ski", "cz", "ow", "ak", "ek", "wicz", "sz", "yk", "ik"],
    "Greek": ["opoulos", "akis", "os", "is", "ou", "ides", "as", "kos", "ak"],
    "Korean": ["k", "im", "pa", "ng", "ch", "oi", "yu", "ju", "on"],
    "Scottish": ["mac", "son", "ton", "ley", "well", "er", "ham", "gill", "ie"],
    "Irish": ["mac", "o", "ley", "an", "son", "ey", "well", "ford", "agh"],
    "Czech": ["ov", "ak", "ek", "sky", "ova", "ic", "cz", "ik", "in"],
    "Vietnamese": ["ng", "uy", "en", "ph", "am", "ho", "an", "tr", "on"],
    "Chinese": ["zh", "ang", "ng", "li", "an", "ch", "en", "wu", "ho"],
    "Portuguese": ["es", "ira", "o", "ano", "elo", "ei", "ares", "ito", "one"],
}
all_categories = list(syllables)
n_categories = len(all_categories)


def make_name(lang, rng):
    n_parts = rng.randint(2, 7) if rng.random() > 0.03 else rng.randint(10, 14)
    parts = [rng.choice(syllables[lang]) for _ in range(n_parts)]
    return "".join(parts).capitalize()


data_rng = random.Random(1)
category_lines = {c: [make_name(c, data_rng) for _ in range(500)] for c in all_categories}


def letterToIndex(letter):
    return all_letters.find(letter)


def lineToTensor(line):
    tensor = torch.zeros(len(line), 1, n_letters)
    for li, letter in enumerate(line):
        tensor[li][0][letterToIndex(letter)] = 1
    return tensor


class RNN(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super(RNN, self).__init__()
        self.hidden_size = hidden_size
        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.i2o = nn.Linear(input_size + hidden_size, output_size)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, input, hidden):
        combined = torch.cat((input, hidden), 1)
        hidden = self.i2h(combined)
        output = self.i2o(combined)
        output = self.softmax(output)
        return output, hidden

    def initHidden(self):
        return torch.zeros(1, self.hidden_size)


n_hidden = 128
rnn = RNN(n_letters, n_hidden, n_categories)


def categoryFromOutput(output):
    top_n, top_i = output.topk(1)
    category_i = top_i[0].item()
    return all_categories[category_i], category_i


def randomChoice(l):
    return l[random.randint(0, len(l) - 1)]


def randomTrainingExample():
    category = randomChoice(all_categories)
    line = randomChoice(category_lines[category])
    category_tensor = torch.tensor([all_categories.index(category)], dtype=torch.long)
    line_tensor = lineToTensor(line)
    return category, line, category_tensor, line_tensor


criterion = nn.NLLLoss()
learning_rate = 0.005


def train(category_tensor, line_tensor):
    hidden = rnn.initHidden()
    rnn.zero_grad()
    for i in range(line_tensor.size()[0]):
        output, hidden = rnn(line_tensor[i], hidden)
    loss = criterion(output, category_tensor)
    loss.backward()
    # Add parameters' gradients to their values, multiplied by learning rate
    for p in rnn.parameters():
        p.data.add_(p.grad.data, alpha=-learning_rate)
    return output, loss.item()


n_iters = 15000
print_every = 500

current_loss = 0
start = time.time()


def timeSince(since):
    s = time.time() - since
    m = math.floor(s / 60)
    s -= m * 60
    return "%dm %ds" % (m, s)


for iter in range(1, n_iters + 1):
    category, line, category_tensor, line_tensor = randomTrainingExample()
    output, loss = train(category_tensor, line_tensor)
    current_loss += loss
    if iter % print_every == 0:
        guess, guess_i = categoryFromOutput(output)
        correct = "✓" if guess == category else "✗ (%s)" % category
        print("%d %d%% (%s) %.4f %s / %s %s" % (iter, iter / n_iters * 100, timeSince(start),
                                               loss, line, guess, correct))
