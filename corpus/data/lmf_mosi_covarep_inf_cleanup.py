"""Low-rank Multimodal Fusion (LMF) on CMU-MOSI features whose acoustic part holds -inf.

Setting: Justin1904/Low-rank-Multimodal-Fusion trains a sentiment regressor on the released
``mosi.pkl`` (per-utterance COVAREP audio features, FACET visual features, GloVe word
sequences).  ``utils.load_mosi`` unpickles the splits, wraps them in a small ``MOSI`` Dataset and
then "removes possible NaN values" with ``x[x != x] = 0`` before ``train_mosi.py`` runs its
hyper-parameter search (SubNet = BatchNorm1d + 3 Linear for audio/video, an LSTM for text, a
rank-r fusion; L1 loss summed over the batch; Adam with a separate group for the factors).

Bug: COVAREP writes ``-inf`` for log-domain features of silent stretches, so a few utterances of
the released features carry infinite acoustic values.  ``x != x`` is only true for NaN, so the
clean-up keeps the infinities.  Nothing happens until the shuffled loader serves a batch that
contains one of those utterances: the audio BatchNorm1d then computes an infinite mean and a
NaN variance, the whole batch output and the summed L1 loss are NaN, the backward pass puts NaN
into every gradient and Adam into every weight, and the epoch's average training loss is NaN
("Training got into NaN values").

Report: https://github.com/Justin1904/Low-rank-Multimodal-Fusion/issues/6 ("I find some value
in the feature array is inf, causing the training loss NAN").
Fix (the maintainer's answer: "inf values do appear in acoustic features due to the issues with
COVAREP feature extraction. We replaced them with 0s"): make the clean-up in ``load_mosi``
replace every non-finite value, i.e. ``train_set.audio[~np.isfinite(train_set.audio)] = 0``.
"""
from __future__ import print_function
import argparse
import os
import pickle
import random
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parameter import Parameter
from torch.nn.init import xavier_normal_
from torch.utils.data import DataLoader, Dataset

AUDIO = b'covarep'
VISUAL = b'facet'
TEXT = b'glove'
LABEL = b'label'
TRAIN = b'train'
VALID = b'valid'
TEST = b'test'


def total(params):
    '''
    count the total number of hyperparameter settings
    '''
    settings = 1
    for k, v in params.items():
        settings *= len(v)
    return settings


def write_released_mosi_pkl(data_path, seed=3):
    '''
    Stand-in for the released mosi.pkl: utterance-level (time-averaged) features with the
    same layout; a few COVAREP rows carry -inf, a few FACET rows NaN (no face found).
    '''
    rng = np.random.RandomState(seed)
    w_text = rng.normal(size=(50,)) / 7.0
    w_audio = rng.normal(size=(5,))
    w_video = rng.normal(size=(20,)) / 4.0
    data = {}
    for split, n in ((TRAIN, 640), (VALID, 120), (TEST, 160)):
        text = rng.normal(size=(n, 20, 50)).astype(np.float32)
        audio = rng.normal(size=(n, 5)).astype(np.float32)
        visual = rng.normal(size=(n, 20)).astype(np.float32)
        score = np.tanh(text.mean(1) @ w_text * 3 + audio @ w_audio * 0.3 + visual @ w_video * 0.3)
        label = np.clip(3 * score + rng.normal(0, 0.3, size=n), -3, 3).astype(np.float32)
        visual[rng.choice(n, 4, replace=False), rng.randint(0, 20)] = np.nan
        if split == TRAIN:
            audio[[154, 216, 522], 1] = -np.inf      # COVAREP log-energy of silent stretches
            audio[[40, 601], 3] = np.nan
        data[split] = {AUDIO: audio, VISUAL: visual, TEXT: text, LABEL: label.reshape(n, 1)}
    with open(os.path.join(data_path, "mosi.pkl"), 'wb') as f:
        pickle.dump(data, f)


def load_mosi(data_path):

    # parse the input args
    class MOSI(Dataset):
        '''
        PyTorch Dataset for MOSI, don't need to change this
        '''

        def __init__(self, audio, visual, text, labels):
            self.audio = audio
            self.visual = visual
            self.text = text
            self.labels = labels

        def __getitem__(self, idx):
            return [self.audio[idx, :], self.visual[idx, :], self.text[idx, :, :], self.labels[idx]]

        def __len__(self):
            return self.audio.shape[0]

    mosi_data = pickle.load(open(os.path.join(data_path, "mosi.pkl"), 'rb'), encoding='bytes')
    mosi_train, mosi_valid, mosi_test = mosi_data[TRAIN], mosi_data[VALID], mosi_data[TEST]

    train_audio, train_visual, train_text, train_labels \
        = mosi_train[AUDIO], mosi_train[VISUAL], mosi_train[TEXT], mosi_train[LABEL]
    valid_audio, valid_visual, valid_text, valid_labels \
        = mosi_valid[AUDIO], mosi_valid[VISUAL], mosi_valid[TEXT], mosi_valid[LABEL]
    test_audio, test_visual, test_text, test_labels \
        = mosi_test[AUDIO], mosi_test[VISUAL], mosi_test[TEXT], mosi_test[LABEL]

    print(train_audio.shape)
    print(train_visual.shape)
    print(train_text.shape)
    print(train_labels.shape)

    # code that instantiates the Dataset objects
    train_set = MOSI(train_audio, train_visual, train_text, train_labels)
    valid_set = MOSI(valid_audio, valid_visual, valid_text, valid_labels)
    test_set = MOSI(test_audio, test_visual, test_text, test_labels)

    audio_dim = train_set[0][0].shape[0]
    print("Audio feature dimension is: {}".format(audio_dim))
    visual_dim = train_set[0][1].shape[0]
    print("Visual feature dimension is: {}".format(visual_dim))
    text_dim = train_set[0][2].shape[1]
    print("Text feature dimension is: {}".format(text_dim))
    input_dims = (audio_dim, visual_dim, text_dim)

    # remove possible NaN values
    train_set.visual[train_set.visual != train_set.visual] = 0
    valid_set.visual[valid_set.visual != valid_set.visual] = 0
    test_set.visual[test_set.visual != test_set.visual] = 0

    train_set.audio[train_set.audio != train_set.audio] = 0
    valid_set.audio[valid_set.audio != valid_set.audio] = 0
    test_set.audio[test_set.audio != test_set.audio] = 0

    return train_set, valid_set, test_set, input_dims


class SubNet(nn.Module):
    '''
    The subnetwork that is used in LMF for video and audio in the pre-fusion stage
    '''

    def __init__(self, in_size, hidden_size, dropout):
        super(SubNet, self).__init__()
        self.norm = nn.BatchNorm1d(in_size)
        self.drop = nn.Dropout(p=dropout)
        self.linear_1 = nn.Linear(in_size, hidden_size)
        self.linear_2 = nn.Linear(hidden_size, hidden_size)
        self.linear_3 = nn.Linear(hidden_size, hidden_size)

    def forward(self, x):
        normed = self.norm(x)
        dropped = self.drop(normed)
        y_1 = F.relu(self.linear_1(dropped))
        y_2 = F.relu(self.linear_2(y_1))
        y_3 = F.relu(self.linear_3(y_2))
        return y_3


class TextSubNet(nn.Module):
    '''
    The LSTM-based subnetwork that is used in LMF for text
    '''

    def __init__(self, in_size, hidden_size, out_size, num_layers=1, dropout=0.2, bidirectional=False):
        super(TextSubNet, self).__init__()
        self.rnn = nn.LSTM(in_size, hidden_size, num_layers=num_layers, bidirectional=bidirectional,
                           batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.linear_1 = nn.Linear(hidden_size, out_size)

    def forward(self, x):
        _, final_states = self.rnn(x)
        h = self.dropout(final_states[0].squeeze(0))
        y_1 = self.linear_1(h)
        return y_1


class LMF(nn.Module):
    '''
    Low-rank Multimodal Fusion
    '''

    def __init__(self, input_dims, hidden_dims, text_out, dropouts, output_dim, rank):
        super(LMF, self).__init__()
        self.audio_in, self.video_in, self.text_in = input_dims
        self.audio_hidden, self.video_hidden, self.text_hidden = hidden_dims
        self.text_out = text_out
        self.output_dim = output_dim
        self.rank = rank
        self.audio_prob, self.video_prob, self.text_prob, self.post_fusion_prob = dropouts

        # define the pre-fusion subnetworks
        self.audio_subnet = SubNet(self.audio_in, self.audio_hidden, self.audio_prob)
        self.video_subnet = SubNet(self.video_in, self.video_hidden, self.video_prob)
        self.text_subnet = TextSubNet(self.text_in, self.text_hidden, self.text_out, dropout=self.text_prob)

        # define the post_fusion layers
        self.post_fusion_dropout = nn.Dropout(p=self.post_fusion_prob)
        self.audio_factor = Parameter(torch.Tensor(self.rank, self.audio_hidden + 1, self.output_dim))
        self.video_factor = Parameter(torch.Tensor(self.rank, self.video_hidden + 1, self.output_dim))
        self.text_factor = Parameter(torch.Tensor(self.rank, self.text_out + 1, self.output_dim))
        self.fusion_weights = Parameter(torch.Tensor(1, self.rank))
        self.fusion_bias = Parameter(torch.Tensor(1, self.output_dim))

        # init teh factors
        xavier_normal_(self.audio_factor)
        xavier_normal_(self.video_factor)
        xavier_normal_(self.text_factor)
        xavier_normal_(self.fusion_weights)
        self.fusion_bias.data.fill_(0)

    def forward(self, audio_x, video_x, text_x):
        audio_h = self.audio_subnet(audio_x)
        video_h = self.video_subnet(video_x)
        text_h = self.text_subnet(text_x)
        batch_size = audio_h.data.shape[0]

        # next we perform low-rank multimodal fusion
        # here is a more efficient implementation than the one the paper describes
        # basically swapping the order of summation and elementwise product
        ones = torch.ones(batch_size, 1, dtype=audio_h.dtype)
        _audio_h = torch.cat((ones, audio_h), dim=1)
        _video_h = torch.cat((ones, video_h), dim=1)
        _text_h = torch.cat((ones, text_h), dim=1)

        fusion_audio = torch.matmul(_audio_h, self.audio_factor)
        fusion_video = torch.matmul(_video_h, self.video_factor)
        fusion_text = torch.matmul(_text_h, self.text_factor)
        fusion_zy = fusion_audio * fusion_video * fusion_text

        # use linear transformation instead of simple summation, more flexibility
        output = torch.matmul(self.fusion_weights, fusion_zy.permute(1, 0, 2)).squeeze() + self.fusion_bias
        output = output.view(-1, self.output_dim)
        return output


def main(options):
    DTYPE = torch.FloatTensor

    # parse the input args
    run_id = options['run_id']
    epochs = options['epochs']
    data_path = options['data_path']
    patience = options['patience']
    output_dim = options['output_dim']

    print("Training initializing... Setup ID is: {}".format(run_id))
    if data_path is None:
        data_path = tempfile.mkdtemp(prefix='mosi_')
        write_released_mosi_pkl(data_path)

    train_set, valid_set, test_set, input_dims = load_mosi(data_path)

    params = dict()
    params['audio_hidden'] = [4, 8, 16]
    params['video_hidden'] = [4, 8, 16]
    params['text_hidden'] = [32, 64]
    params['audio_dropout'] = [0, 0.1, 0.15, 0.2]
    params['video_dropout'] = [0, 0.1, 0.15, 0.2]
    params['text_dropout'] = [0, 0.1, 0.15, 0.2]
    params['factor_learning_rate'] = [0.0005, 0.001]
    params['learning_rate'] = [0.0005, 0.001]
    params['rank'] = [1, 4, 8]
    params['batch_size'] = [32]
    params['weight_decay'] = [0, 0.001]

    total_settings = total(params)
    print("There are {} different hyper-parameter settings in total.".format(total_settings))

    random.seed(run_id)
    torch.manual_seed(run_id)
    for i in range(options['max_settings']):

        ahid = random.choice(params['audio_hidden'])
        vhid = random.choice(params['video_hidden'])
        thid = random.choice(params['text_hidden'])
        thid_2 = thid // 2
        adr = random.choice(params['audio_dropout'])
        vdr = random.choice(params['video_dropout'])
        tdr = random.choice(params['text_dropout'])
        factor_lr = random.choice(params['factor_learning_rate'])
        lr = random.choice(params['learning_rate'])
        r = random.choice(params['rank'])
        batch_sz = random.choice(params['batch_size'])
        decay = random.choice(params['weight_decay'])

        model = LMF(input_dims, (ahid, vhid, thid), thid_2, (adr, vdr, tdr, 0.5), output_dim, r)
        print("Model initialized")
        criterion = nn.L1Loss(reduction='sum')
        factors = list(model.parameters())[:3]
        other = list(model.parameters())[3:]
        optimizer = optim.Adam([{"params": factors, "lr": factor_lr}, {"params": other, "lr": lr}],
                               weight_decay=decay)

        # setup training
        complete = True
        min_valid_loss = float('Inf')
        train_iterator = DataLoader(train_set, batch_size=batch_sz, num_workers=0, shuffle=True)
        valid_iterator = DataLoader(valid_set, batch_size=len(valid_set), num_workers=0, shuffle=True)
        curr_patience = patience
        step = 0

        for e in range(epochs):
            model.train()
            model.zero_grad()
            avg_train_loss = 0.0
            for batch in train_iterator:
                model.zero_grad()

                x = batch[:-1]
                x_a = x[0].float().type(DTYPE).squeeze()
                x_v = x[1].float().type(DTYPE).squeeze()
                x_t = x[2].float().type(DTYPE)
                y = batch[-1].view(-1, output_dim).float().type(DTYPE)
                output = model(x_a, x_v, x_t)
                loss = criterion(output, y)
                loss.backward()
                avg_loss = loss.item()
                avg_train_loss += avg_loss / len(train_set)
                optimizer.step()
                step += 1
                if options['verbose']:
                    print("  step {} batch L1 loss: {:.4f}".format(step, avg_loss / len(y)))

            print("Epoch {} complete! Average Training loss: {}".format(e, avg_train_loss))

            # Terminate the training process if run into NaN
            if np.isnan(avg_train_loss):
                print("Training got into NaN values...\n\n")
                complete = False
                break

            model.eval()
            with torch.no_grad():
                for batch in valid_iterator:
                    x = batch[:-1]
                    x_a = x[0].float().type(DTYPE).squeeze()
                    x_v = x[1].float().type(DTYPE).squeeze()
                    x_t = x[2].float().type(DTYPE)
                    y = batch[-1].view(-1, output_dim).float().type(DTYPE)
                    output = model(x_a, x_v, x_t)
                    valid_loss = criterion(output, y)
                    avg_valid_loss = valid_loss.item()

            if np.isnan(avg_valid_loss):
                print("Training got into NaN values...\n\n")
                complete = False
                break

            avg_valid_loss = avg_valid_loss / len(valid_set)
            print("Validation loss is: {}".format(avg_valid_loss))

            if avg_valid_loss < min_valid_loss:
                curr_patience = patience
                min_valid_loss = avg_valid_loss
                print("Found new best model")
            else:
                curr_patience -= 1

            if curr_patience <= 0:
                break

        print("Setting {} finished, complete={}, best validation MAE={}".format(i, complete, min_valid_loss))


if __name__ == "__main__":
    OPTIONS = argparse.ArgumentParser()
    OPTIONS.add_argument('--run_id', dest='run_id', type=int, default=1)
    OPTIONS.add_argument('--epochs', dest='epochs', type=int, default=3)
    OPTIONS.add_argument('--patience', dest='patience', type=int, default=20)
    OPTIONS.add_argument('--output_dim', dest='output_dim', type=int, default=1)
    OPTIONS.add_argument('--max_settings', dest='max_settings', type=int, default=1)
    OPTIONS.add_argument('--verbose', dest='verbose', type=int, default=1)
    OPTIONS.add_argument('--data_path', dest='data_path', type=str, default=None)
    PARAMS = vars(OPTIONS.parse_args())
    torch.set_num_threads(2)

    main(PARAMS)
