'''
Build a neural machine translation model with soft attention (dl4mt-tutorial
session2 style, ported to PyTorch): parameters live in an OrderedDict keyed
'encoder_U', 'decoder_Wc_att', 'ff_logit_W', ...; train() takes every option as
a keyword argument and the bottom of the file calls it like train_nmt.py does.

Setting: GRU encoder + conditional GRU decoder with additive attention, cost =
per-sentence sum of target-word NLL (mean over the batch), the plain 'sgd'
optimizer of nmt.py (p <- p - lrate * g, lrate 1.0).  Data: a synthetic
"translation" corpus (target = source reversed through a fixed word mapping),
sentences of 8..40 words.

Bug: the call at the bottom passes clip_c=-1., which switches off the global
gradient-norm clipping block of train() ("apply gradient clipping here").  The
per-sentence summed cost over long sentences gives gradients whose global norm
sits in the tens and now and then jumps by orders of magnitude; each such step
of lrate 1.0 throws the recurrent weights far away, the next forward saturates
and the cost blows up to inf/nan - "NaN detected" and train() returns.

Fix (nyu-dl/dl4mt-tutorial#64, confirmed there by a user after the maintainer's
pointers in #60): set clip-c to 1.0, i.e. enable the clipping block; the
learning rate is unchanged.

Source: https://github.com/nyu-dl/dl4mt-tutorial/issues/64
'''
import time
import copy
from collections import OrderedDict

import numpy
import torch
import torch.nn.functional as F

profile = False


# make prefix-appended name
def _p(pp, name):
    return '%s_%s' % (pp, name)


# some utilities
def ortho_weight(ndim):
    W = numpy.random.randn(ndim, ndim)
    u, s, v = numpy.linalg.svd(W)
    return u.astype('float32')


def norm_weight(nin, nout=None, scale=0.01, ortho=True):
    if nout is None:
        nout = nin
    if nout == nin and ortho:
        W = ortho_weight(nin)
    else:
        W = scale * numpy.random.randn(nin, nout)
    return W.astype('float32')


# initialize torch "shared variables" according to the initial parameters
def init_tparams(params):
    tparams = OrderedDict()
    for kk, pp in params.items():
        tparams[kk] = torch.tensor(pp, requires_grad=True)
    return tparams


def itemlist(tparams):
    return [vv for kk, vv in tparams.items()]


# synthetic parallel corpus: target is the reversed source through a word map
class TextIterator:
    def __init__(self, n_sents, n_words_src, n_words, batch_size, maxlen, seed):
        rng = numpy.random.RandomState(seed)
        mapping = rng.permutation(n_words - 2) + 2
        self.source, self.target = [], []
        for _ in range(n_sents):
            ll = rng.randint(8, maxlen)
            s = list(rng.randint(2, n_words_src, size=ll))
            t = [int(mapping[(w - 2) % (n_words - 2)]) for w in reversed(s)]
            self.source.append(s)
            self.target.append(t)
        self.batch_size = batch_size

    def __iter__(self):
        for ii in range(0, len(self.source), self.batch_size):
            yield (self.source[ii:ii + self.batch_size],
                   self.target[ii:ii + self.batch_size])


# batch preparation
def prepare_data(seqs_x, seqs_y, maxlen=None):
    lengths_x = [len(s) for s in seqs_x]
    lengths_y = [len(s) for s in seqs_y]
    n_samples = len(seqs_x)
    maxlen_x = numpy.max(lengths_x) + 1
    maxlen_y = numpy.max(lengths_y) + 1

    x = numpy.zeros((maxlen_x, n_samples)).astype('int64')
    y = numpy.zeros((maxlen_y, n_samples)).astype('int64')
    x_mask = numpy.zeros((maxlen_x, n_samples)).astype('float32')
    y_mask = numpy.zeros((maxlen_y, n_samples)).astype('float32')
    for idx, [s_x, s_y] in enumerate(zip(seqs_x, seqs_y)):
        x[:lengths_x[idx], idx] = s_x
        x_mask[:lengths_x[idx] + 1, idx] = 1.
        y[:lengths_y[idx], idx] = s_y
        y_mask[:lengths_y[idx] + 1, idx] = 1.

    return (torch.from_numpy(x), torch.from_numpy(x_mask),
            torch.from_numpy(y), torch.from_numpy(y_mask))


# GRU layer
def param_init_gru(options, params, prefix='gru', nin=None, dim=None):
    params[_p(prefix, 'W')] = numpy.concatenate([norm_weight(nin, dim),
                                                 norm_weight(nin, dim)], axis=1)
    params[_p(prefix, 'b')] = numpy.zeros((2 * dim,)).astype('float32')
    params[_p(prefix, 'U')] = numpy.concatenate([ortho_weight(dim),
                                                 ortho_weight(dim)], axis=1)
    params[_p(prefix, 'Wx')] = norm_weight(nin, dim)
    params[_p(prefix, 'bx')] = numpy.zeros((dim,)).astype('float32')
    params[_p(prefix, 'Ux')] = ortho_weight(dim)
    return params


def gru_layer(tparams, state_below, options, prefix='gru', mask=None):
    nsteps, n_samples = state_below.shape[0], state_below.shape[1]
    dim = tparams[_p(prefix, 'Ux')].shape[1]
    state_below_ = state_below @ tparams[_p(prefix, 'W')] + tparams[_p(prefix, 'b')]
    state_belowx = state_below @ tparams[_p(prefix, 'Wx')] + tparams[_p(prefix, 'bx')]
    h_ = torch.zeros(n_samples, dim)
    rval = []
    for t in range(nsteps):
        m_ = mask[t]
        preact = h_ @ tparams[_p(prefix, 'U')] + state_below_[t]
        r = torch.sigmoid(preact[:, :dim])
        u = torch.sigmoid(preact[:, dim:])
        preactx = (h_ @ tparams[_p(prefix, 'Ux')]) * r + state_belowx[t]
        h = torch.tanh(preactx)
        h = u * h_ + (1. - u) * h
        h = m_[:, None] * h + (1. - m_)[:, None] * h_
        rval.append(h)
        h_ = h
    return torch.stack(rval)


# Conditional GRU layer with Attention
def param_init_gru_cond(options, params, prefix='gru_cond', nin=None, dim=None,
                        dimctx=None):
    params = param_init_gru(options, params, prefix, nin=nin, dim=dim)
    params[_p(prefix, 'U_nl')] = numpy.concatenate([ortho_weight(dim),
                                                    ortho_weight(dim)], axis=1)
    params[_p(prefix, 'b_nl')] = numpy.zeros((2 * dim,)).astype('float32')
    params[_p(prefix, 'Ux_nl')] = ortho_weight(dim)
    params[_p(prefix, 'bx_nl')] = numpy.zeros((dim,)).astype('float32')
    params[_p(prefix, 'Wc')] = norm_weight(dimctx, dim * 2)
    params[_p(prefix, 'Wcx')] = norm_weight(dimctx, dim)
    params[_p(prefix, 'W_comb_att')] = norm_weight(dim, dimctx)
    params[_p(prefix, 'Wc_att')] = norm_weight(dimctx)
    params[_p(prefix, 'b_att')] = numpy.zeros((dimctx,)).astype('float32')
    params[_p(prefix, 'U_att')] = norm_weight(dimctx, 1)
    params[_p(prefix, 'c_tt')] = numpy.zeros((1,)).astype('float32')
    return params


def gru_cond_layer(tparams, state_below, options, prefix='gru', mask=None,
                   context=None, init_state=None, context_mask=None):
    nsteps = state_below.shape[0]
    dim = tparams[_p(prefix, 'Wcx')].shape[1]
    pctx_ = context @ tparams[_p(prefix, 'Wc_att')] + tparams[_p(prefix, 'b_att')]
    state_belowx = state_below @ tparams[_p(prefix, 'Wx')] + tparams[_p(prefix, 'bx')]
    state_below_ = state_below @ tparams[_p(prefix, 'W')] + tparams[_p(prefix, 'b')]
    h_ = init_state
    hs, ctxs = [], []
    for t in range(nsteps):
        m_ = mask[t]
        preact1 = torch.sigmoid(h_ @ tparams[_p(prefix, 'U')] + state_below_[t])
        r1, u1 = preact1[:, :dim], preact1[:, dim:]
        preactx1 = (h_ @ tparams[_p(prefix, 'Ux')]) * r1 + state_belowx[t]
        h1 = torch.tanh(preactx1)
        h1 = u1 * h_ + (1. - u1) * h1
        h1 = m_[:, None] * h1 + (1. - m_)[:, None] * h_

        # attention
        pstate_ = h1 @ tparams[_p(prefix, 'W_comb_att')]
        pctx__ = torch.tanh(pctx_ + pstate_[None, :, :])
        alpha = (pctx__ @ tparams[_p(prefix, 'U_att')] + tparams[_p(prefix, 'c_tt')])
        alpha = alpha.reshape(alpha.shape[0], alpha.shape[1])
        alpha = torch.exp(alpha)
        alpha = alpha * context_mask
        alpha = alpha / alpha.sum(0, keepdim=True)
        ctx_ = (context * alpha[:, :, None]).sum(0)  # current context

        preact2 = h1 @ tparams[_p(prefix, 'U_nl')] + tparams[_p(prefix, 'b_nl')]
        preact2 = torch.sigmoid(preact2 + ctx_ @ tparams[_p(prefix, 'Wc')])
        r2, u2 = preact2[:, :dim], preact2[:, dim:]
        preactx2 = (h1 @ tparams[_p(prefix, 'Ux_nl')] + tparams[_p(prefix, 'bx_nl')]) * r2
        preactx2 = preactx2 + ctx_ @ tparams[_p(prefix, 'Wcx')]
        h2 = torch.tanh(preactx2)
        h2 = u2 * h1 + (1. - u2) * h2
        h2 = m_[:, None] * h2 + (1. - m_)[:, None] * h1
        hs.append(h2)
        ctxs.append(ctx_)
        h_ = h2
    return torch.stack(hs), torch.stack(ctxs)


# initialize all parameters
def init_params(options):
    params = OrderedDict()
    params['Wemb'] = norm_weight(options['n_words_src'], options['dim_word'])
    params['Wemb_dec'] = norm_weight(options['n_words'], options['dim_word'])
    params = param_init_gru(options, params, prefix='encoder',
                            nin=options['dim_word'], dim=options['dim'])
    ctxdim = options['dim']
    params['ff_state_W'] = norm_weight(ctxdim, options['dim'])
    params['ff_state_b'] = numpy.zeros((options['dim'],)).astype('float32')
    params = param_init_gru_cond(options, params, prefix='decoder',
                                 nin=options['dim_word'], dim=options['dim'],
                                 dimctx=ctxdim)
    params['ff_logit_lstm_W'] = norm_weight(options['dim'], options['dim_word'], ortho=False)
    params['ff_logit_lstm_b'] = numpy.zeros((options['dim_word'],)).astype('float32')
    params['ff_logit_prev_W'] = norm_weight(options['dim_word'], options['dim_word'], ortho=False)
    params['ff_logit_prev_b'] = numpy.zeros((options['dim_word'],)).astype('float32')
    params['ff_logit_ctx_W'] = norm_weight(ctxdim, options['dim_word'], ortho=False)
    params['ff_logit_ctx_b'] = numpy.zeros((options['dim_word'],)).astype('float32')
    params['ff_logit_W'] = norm_weight(options['dim_word'], options['n_words'])
    params['ff_logit_b'] = numpy.zeros((options['n_words'],)).astype('float32')
    return params


# build a training model: returns the per-sentence cost
def build_model(tparams, options, x, x_mask, y, y_mask):
    n_timesteps_trg, n_samples = y.shape
    emb = tparams['Wemb'][x]
    ctx = gru_layer(tparams, emb, options, prefix='encoder', mask=x_mask)

    ctx_mean = (ctx * x_mask[:, :, None]).sum(0) / x_mask.sum(0)[:, None]
    init_state = torch.tanh(ctx_mean @ tparams['ff_state_W'] + tparams['ff_state_b'])

    emb = tparams['Wemb_dec'][y]
    emb_shifted = torch.zeros_like(emb)
    emb_shifted[1:] = emb[:-1]
    proj_h, ctxs = gru_cond_layer(tparams, emb_shifted, options, prefix='decoder',
                                  mask=y_mask, context=ctx, init_state=init_state,
                                  context_mask=x_mask)

    logit_lstm = proj_h @ tparams['ff_logit_lstm_W'] + tparams['ff_logit_lstm_b']
    logit_prev = emb_shifted @ tparams['ff_logit_prev_W'] + tparams['ff_logit_prev_b']
    logit_ctx = ctxs @ tparams['ff_logit_ctx_W'] + tparams['ff_logit_ctx_b']
    logit = torch.tanh(logit_lstm + logit_prev + logit_ctx)
    logit = logit @ tparams['ff_logit_W'] + tparams['ff_logit_b']

    logp = F.log_softmax(logit, dim=-1)
    cost = -logp.gather(2, y[:, :, None])[:, :, 0]
    cost = (cost * y_mask).sum(0)
    return cost


def sgd(lr, tparams, grads):
    with torch.no_grad():
        for p, g in zip(itemlist(tparams), grads):
            p -= lr * g


def train(dim_word=100,  # word vector dimensionality
          dim=1000,  # the number of GRU units
          max_epochs=5000,
          finish_after=10000000,  # finish after this many updates
          dispFreq=100,
          decay_c=0.,  # L2 regularization penalty
          clip_c=-1.,  # gradient clipping threshold
          lrate=0.01,  # learning rate
          n_words_src=100000,  # source vocabulary size
          n_words=100000,  # target vocabulary size
          maxlen=100,  # maximum length of the description
          optimizer='sgd',
          batch_size=16,
          n_sents=1000,
          seed=1234):

    # Model options
    model_options = locals().copy()
    numpy.random.seed(seed)
    torch.manual_seed(seed)

    print('Loading data')
    train = TextIterator(n_sents, n_words_src, n_words, batch_size, maxlen, seed)

    print('Building model')
    params = init_params(model_options)
    tparams = init_tparams(params)

    print('Optimization')
    uidx = 0
    for eidx in range(max_epochs):
        n_samples = 0
        for x, y in train:
            n_samples += len(x)
            uidx += 1
            x, x_mask, y, y_mask = prepare_data(x, y, maxlen=maxlen)

            ud_start = time.time()
            cost = build_model(tparams, model_options, x, x_mask, y, y_mask).mean()

            # apply L2 regularization on weights
            if decay_c > 0.:
                weight_decay = 0.
                for kk, vv in tparams.items():
                    weight_decay += (vv ** 2).sum()
                cost = cost + decay_c * weight_decay

            grads = torch.autograd.grad(cost, itemlist(tparams))

            # apply gradient clipping here
            if clip_c > 0.:
                g2 = 0.
                for g in grads:
                    g2 += (g ** 2).sum()
                new_grads = []
                for g in grads:
                    new_grads.append(torch.where(g2 > (clip_c ** 2),
                                                 g / torch.sqrt(g2) * clip_c, g))
                grads = new_grads

            # do the update on parameters
            eval(optimizer)(lrate, tparams, grads)
            ud = time.time() - ud_start

            cost = cost.item()
            # check for bad numbers
            if numpy.isnan(cost) or numpy.isinf(cost):
                print('Epoch ', eidx, 'Update ', uidx, 'Cost ', cost)
                print('NaN detected')
                return 1., 1., 1.

            if numpy.mod(uidx, dispFreq) == 0:
                print('Epoch ', eidx, 'Update ', uidx, 'Cost ', cost, 'UD ', ud)

            if uidx >= finish_after:
                print('Finishing after %d iterations!' % uidx)
                return cost, cost, cost

        print('Seen %d samples' % n_samples)
    return cost, cost, cost


if __name__ == '__main__':
    validerr = train(dim_word=48,
                     dim=64,
                     n_words_src=60,
                     n_words=60,
                     decay_c=0.,
                     clip_c=-1.,
                     lrate=1.0,
                     optimizer='sgd',
                     maxlen=30,
                     batch_size=16,
                     n_sents=320,
                     max_epochs=10,
                     dispFreq=5,
                     finish_after=30)
    print(validerr)
