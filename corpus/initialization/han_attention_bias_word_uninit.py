"""Hierarchical Attention Network (word GRU + attention, sentence GRU + attention) for
document rating classification, written like the attention-networks-for-classification
notebook (batch_matmul_bias / batch_matmul / attention_mul helpers, AttentionWordRNN and
AttentionSentRNN modules, train_data / pad_batch / gen_minibatch / train_early_stopping).

Setting: synthetic "reviews" (documents of sentences of token ids) with a 5-star rating
that depends on how many positive / negative words they contain.  Two SGD optimizers
(word model, sentence model), NLLLoss on the log-softmax of the sentence model.  The
run calls torch.use_deterministic_algorithms(True) so that it is reproducible.

Bug (initialization): the attention MLP biases of both levels are created with
``nn.Parameter(torch.Tensor(2 * hidden, 1))`` and, unlike weight_W_* and weight_proj_*,
never initialised.  torch.Tensor(...) returns uninitialised memory; in deterministic
mode PyTorch fills such memory with NaN (without it the values are whatever garbage is
in the allocation, which is why the original report saw it "sometimes").  The word-level
attention scores tanh(h W + b) are NaN, the softmax over words is NaN, every document
vector is NaN and the loss is nan from the very first mini-batch; SGD then writes NaN
into every other weight.

Fix (the thread's resolution, confirmed by the reporter): initialise the two biases like
the other attention parameters, ``self.bias_word.data.uniform_(-0.1, 0.1)`` in
AttentionWordRNN.__init__ and ``self.bias_sent.data.uniform_(-0.1, 0.1)`` in
AttentionSentRNN.__init__.

Report: https://github.com/EdGENetworks/attention-networks-for-classification/issues/7
("Loss can start as NaN" -- "two parameters (bias_word and bias_sent) are not
initialized which may contain NaN. Add self.bias_word.data.uniform_(-0.1,0.1) ...
It solved my problem.")
"""
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(7)
np.random.seed(7)
torch.use_deterministic_algorithms(True)


def batch_matmul_bias(seq, weight, bias, nonlinearity=''):
    s = None
    bias_dim = bias.size()
    for i in range(seq.size(0)):
        _s = torch.mm(seq[i], weight)
        _s_bias = _s + bias.expand(bias_dim[0], _s.size()[0]).transpose(0, 1)
        if nonlinearity == 'tanh':
            _s_bias = torch.tanh(_s_bias)
        _s_bias = _s_bias.unsqueeze(0)
        s = _s_bias if s is None else torch.cat((s, _s_bias), 0)
    return s.squeeze(-1) if s.size(-1) == 1 else s


def batch_matmul(seq, weight, nonlinearity=''):
    s = None
    for i in range(seq.size(0)):
        _s = torch.mm(seq[i], weight)
        if nonlinearity == 'tanh':
            _s = torch.tanh(_s)
        _s = _s.unsqueeze(0)
        s = _s if s is None else torch.cat((s, _s), 0)
    return s.squeeze(-1)


def attention_mul(rnn_outputs, att_weights):
    attn_vectors = None
    for i in range(rnn_outputs.size(0)):
        h_i = rnn_outputs[i]
        a_i = att_weights[i].unsqueeze(1).expand_as(h_i)
        h_i = (a_i * h_i).unsqueeze(0)
        attn_vectors = h_i if attn_vectors is None else torch.cat((attn_vectors, h_i), 0)
    return torch.sum(attn_vectors, 0).unsqueeze(0)


class AttentionWordRNN(nn.Module):

    def __init__(self, batch_size, num_tokens, embed_size, word_gru_hidden, bidirectional=True):
        super(AttentionWordRNN, self).__init__()
        self.batch_size = batch_size
        self.num_tokens = num_tokens
        self.embed_size = embed_size
        self.word_gru_hidden = word_gru_hidden
        self.bidirectional = bidirectional

        self.lookup = nn.Embedding(num_tokens, embed_size)
        self.word_gru = nn.GRU(embed_size, word_gru_hidden, bidirectional=True)
        self.weight_W_word = nn.Parameter(torch.Tensor(2 * word_gru_hidden, 2 * word_gru_hidden))
        self.bias_word = nn.Parameter(torch.Tensor(2 * word_gru_hidden, 1))
        self.weight_proj_word = nn.Parameter(torch.Tensor(2 * word_gru_hidden, 1))
        self.softmax_word = nn.Softmax(dim=1)
        self.weight_W_word.data.uniform_(-0.1, 0.1)
        self.weight_proj_word.data.uniform_(-0.1, 0.1)

    def forward(self, embed, state_word):
        embedded = self.lookup(embed)
        output_word, state_word = self.word_gru(embedded, state_word)
        word_squish = batch_matmul_bias(output_word, self.weight_W_word, self.bias_word, nonlinearity='tanh')
        word_attn = batch_matmul(word_squish, self.weight_proj_word)
        word_attn_norm = self.softmax_word(word_attn.transpose(1, 0))
        word_attn_vectors = attention_mul(output_word, word_attn_norm.transpose(1, 0))
        return word_attn_vectors, state_word, word_attn_norm

    def init_hidden(self):
        return torch.zeros(2, self.batch_size, self.word_gru_hidden)


class AttentionSentRNN(nn.Module):

    def __init__(self, batch_size, sent_gru_hidden, word_gru_hidden, n_classes, bidirectional=True):
        super(AttentionSentRNN, self).__init__()
        self.batch_size = batch_size
        self.sent_gru_hidden = sent_gru_hidden
        self.n_classes = n_classes
        self.word_gru_hidden = word_gru_hidden
        self.bidirectional = bidirectional

        self.sent_gru = nn.GRU(2 * word_gru_hidden, sent_gru_hidden, bidirectional=True)
        self.weight_W_sent = nn.Parameter(torch.Tensor(2 * sent_gru_hidden, 2 * sent_gru_hidden))
        self.bias_sent = nn.Parameter(torch.Tensor(2 * sent_gru_hidden, 1))
        self.weight_proj_sent = nn.Parameter(torch.Tensor(2 * sent_gru_hidden, 1))
        self.final_linear = nn.Linear(2 * sent_gru_hidden, n_classes)
        self.softmax_sent = nn.Softmax(dim=1)
        self.weight_W_sent.data.uniform_(-0.1, 0.1)
        self.weight_proj_sent.data.uniform_(-0.1, 0.1)

    def forward(self, word_attention_vectors, state_sent):
        output_sent, state_sent = self.sent_gru(word_attention_vectors, state_sent)
        sent_squish = batch_matmul_bias(output_sent, self.weight_W_sent, self.bias_sent, nonlinearity='tanh')
        sent_attn = batch_matmul(sent_squish, self.weight_proj_sent)
        sent_attn_norm = self.softmax_sent(sent_attn.transpose(1, 0))
        sent_attn_vectors = attention_mul(output_sent, sent_attn_norm.transpose(1, 0))
        final_map = self.final_linear(sent_attn_vectors.squeeze(0))
        return F.log_softmax(final_map, dim=1), state_sent, sent_attn_norm

    def init_hidden(self):
        return torch.zeros(2, self.batch_size, self.sent_gru_hidden)


# ---------------------------------------------------------------------------------
# data: synthetic reviews, rating 0..4 from the balance of sentiment words
# ---------------------------------------------------------------------------------
NUM_TOKENS = 300
POS_WORDS = np.arange(10, 40)
NEG_WORDS = np.arange(40, 70)


def make_reviews(n_docs, rng):
    docs, ratings = [], []
    for _ in range(n_docs):
        rating = rng.randint(0, 5)
        n_sents = rng.randint(3, 6)
        doc = []
        for _ in range(n_sents):
            sent = list(rng.randint(70, NUM_TOKENS, size=rng.randint(4, 8)))
            n_pos = rng.binomial(3, rating / 4.0)
            n_neg = rng.binomial(3, 1.0 - rating / 4.0)
            for w in list(rng.choice(POS_WORDS, n_pos)) + list(rng.choice(NEG_WORDS, n_neg)):
                sent.insert(rng.randint(0, len(sent) + 1), int(w))
            doc.append(sent)
        docs.append(doc)
        ratings.append(rating)
    return np.array(docs, dtype=object), np.array(ratings, dtype=np.int64)


def pad_batch(mini_batch):
    mini_batch_size = len(mini_batch)
    max_sent_len = int(np.mean([len(x) for x in mini_batch]))
    max_token_len = int(np.mean([len(val) for sublist in mini_batch for val in sublist]))
    main_matrix = np.zeros((mini_batch_size, max_sent_len, max_token_len), dtype=np.int64)
    for i in range(main_matrix.shape[0]):
        for j in range(min(max_sent_len, len(mini_batch[i]))):
            sent = mini_batch[i][j][:max_token_len]
            main_matrix[i, j, :len(sent)] = sent
    return torch.from_numpy(main_matrix).transpose(0, 1)


def iterate_minibatches(inputs, targets, batchsize, shuffle=False):
    assert inputs.shape[0] == targets.shape[0]
    indices = np.arange(inputs.shape[0])
    if shuffle:
        np.random.shuffle(indices)
    for start_idx in range(0, inputs.shape[0] - batchsize + 1, batchsize):
        excerpt = indices[start_idx:start_idx + batchsize]
        yield inputs[excerpt], targets[excerpt]


def gen_minibatch(tokens, labels, mini_batch_size, shuffle=True):
    for token, label in iterate_minibatches(tokens, labels, mini_batch_size, shuffle=shuffle):
        yield pad_batch(token), torch.from_numpy(label)


def get_predictions(val_tokens, word_attn_model, sent_attn_model):
    max_sents, batch_size, max_tokens = val_tokens.size()
    state_word = word_attn_model.init_hidden()
    state_sent = sent_attn_model.init_hidden()
    s = None
    for i in range(max_sents):
        _s, state_word, _ = word_attn_model(val_tokens[i, :, :].transpose(0, 1), state_word)
        s = _s if s is None else torch.cat((s, _s), 0)
    y_pred, state_sent, _ = sent_attn_model(s, state_sent)
    return y_pred


def train_data(mini_batch, targets, word_attn_model, sent_attn_model, word_optimizer, sent_optimizer, criterion):
    word_optimizer.zero_grad()
    sent_optimizer.zero_grad()
    y_pred = get_predictions(mini_batch, word_attn_model, sent_attn_model)
    loss = criterion(y_pred, targets)
    loss.backward()
    word_optimizer.step()
    sent_optimizer.step()
    return loss.item()


def test_accuracy_full_batch(tokens, labels, mini_batch_size, word_attn, sent_attn):
    p, l = [], []
    with torch.no_grad():
        for token, label in gen_minibatch(tokens, labels, mini_batch_size, shuffle=False):
            _, y_pred = torch.max(get_predictions(token, word_attn, sent_attn), 1)
            p.extend(y_pred.numpy().tolist())
            l.extend(label.numpy().tolist())
    return float(np.sum(np.array(p) == np.array(l))) / len(p)


def timeSince(since):
    s = time.time() - since
    m = math.floor(s / 60)
    return '%dm %ds' % (m, s - m * 60)


def train_early_stopping(mini_batch_size, X_train, y_train, X_test, y_test, word_attn_model, sent_attn_model,
                         word_attn_optimiser, sent_attn_optimiser, loss_criterion, num_epoch, print_loss_every=10):
    start = time.time()
    loss_full = []
    loss_epoch = []
    accuracy_epoch = []
    epoch_counter = 0
    g = gen_minibatch(X_train, y_train, mini_batch_size)
    for i in range(1, num_epoch + 1):
        try:
            tokens, labels = next(g)
            loss = train_data(tokens, labels, word_attn_model, sent_attn_model,
                              word_attn_optimiser, sent_attn_optimiser, loss_criterion)
            loss_full.append(loss)
            loss_epoch.append(loss)
            if i % print_loss_every == 0 or i == 1:
                print('Loss at %d minibatches, %d epoch,(%s) is %f' % (i, epoch_counter, timeSince(start), np.mean(loss_epoch)))
        except StopIteration:
            epoch_counter += 1
            acc = test_accuracy_full_batch(X_test, y_test, mini_batch_size, word_attn_model, sent_attn_model)
            accuracy_epoch.append(acc)
            print('Reached %d epocs, loss %f, test accuracy %f' % (epoch_counter, np.mean(loss_epoch), acc))
            loss_epoch = []
            g = gen_minibatch(X_train, y_train, mini_batch_size)
    return loss_full


if __name__ == '__main__':
    rng = np.random.RandomState(42)
    X, y = make_reviews(320, rng)
    X_train, y_train, X_test, y_test = X[:256], y[:256], X[256:], y[256:]

    batch_size = 16
    word_attn = AttentionWordRNN(batch_size=batch_size, num_tokens=NUM_TOKENS, embed_size=24,
                                 word_gru_hidden=16, bidirectional=True)
    sent_attn = AttentionSentRNN(batch_size=batch_size, sent_gru_hidden=16, word_gru_hidden=16,
                                 n_classes=5, bidirectional=True)

    learning_rate = 1e-1
    momentum = 0.9
    word_optmizer = torch.optim.SGD(word_attn.parameters(), lr=learning_rate, momentum=momentum)
    sent_optimizer = torch.optim.SGD(sent_attn.parameters(), lr=learning_rate, momentum=momentum)
    criterion = nn.NLLLoss()

    train_early_stopping(batch_size, X_train, y_train, X_test, y_test, word_attn, sent_attn,
                         word_optmizer, sent_optimizer, criterion, num_epoch=68, print_loss_every=8)
