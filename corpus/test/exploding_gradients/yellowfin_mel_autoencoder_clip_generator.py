"""MLP autoencoder on log-mel frames trained with the YellowFin tuner (PyTorch port, mid-2017).

Setting: the YFOptimizer class is vendored from JianGoForIt/YellowFin_Pytorch
(tuner_utils/yellowfin.py) as it was before 2017-07-03, and the training script follows the
repo's pytorch-cifar/main.py layout (module-level argparse flags, --opt_method YF, train(epoch)
returning loss / lr / mu lists that are saved to --logdir).  The model is a small MLP
autoencoder compressing 64-bin log-mel frames (dB, mean-normalised per bin, variance left as
is) to a 16-d code; the optimizer is created the way the README shows:
YFOptimizer(net.parameters(), lr=1.0, mu=0.0, clip_thresh=1.0).

Bug: YFOptimizer keeps var_list as it is passed.  net.parameters() is a generator; it is
consumed once by the torch.optim.SGD built inside __init__, so the later
torch.nn.utils.clip_grad_norm_(self._var_list, self._clip_thresh) in step() iterates over an
exhausted generator and clips nothing (recent PyTorch only warns "`parameters` is an empty
generator").  Without clipping, the first plain-SGD steps at YellowFin's initial lr 1.0 are far
too large for this network: the reconstruction MSE goes 26.2, 21.7, 9.0e5, inf (iteration 3)
and the tuner then dies in np.roots with "LinAlgError: Array must not contain infs or NaNs",
the error in the report.

Fix (maintainers, commit 13b833e "fix clip issue due to use of var list generator"; README:
"Fixed a gradient clipping bug ... make gradient clipping great again in YellowFin"):
self._var_list = list(var_list), so the gradient-norm clipping at clip_thresh really runs;
the run then trains (epoch-mean MSE 16.0 -> 9.1 over 4 epochs).

Report: https://github.com/JianGoForIt/YellowFin_Pytorch/issues/1 ("NaN and AssertionError":
simple MLP / MLP autoencoder / residual-net runs end in LinAlgError or AssertionError after a
few steps; "I tried 13b833e again and additionally used gradient clipping this time. The
combination of both solved the issue for me").
"""
from __future__ import print_function

import argparse
import math
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn


class YFOptimizer(object):
  def __init__(self, var_list, lr=0.1, mu=0.0, clip_thresh=None, weight_decay=0.0,
    beta=0.999, curv_win_width=20, zero_debias=True, delta_mu=0.0):
    '''
    clip thresh is the threshold value on ||lr * gradient||
    Args:
      lr: python scalar. The initial value of learning rate, we use 1.0 in our paper.
      mu: python scalar. The initial value of momentum, we use 0.0 in our paper.
      clip_thresh: python scalar. The cliping threshold for clip_grad_norm.
        if None, no clipping will be carried out.
      beta: python scalar. The smoothing parameter for estimations.
    '''
    self._lr = lr
    self._mu = mu
    self._var_list = var_list
    self._clip_thresh = clip_thresh
    self._beta = beta
    self._curv_win_width = curv_win_width
    self._zero_debias = zero_debias
    self._optimizer = torch.optim.SGD(self._var_list, lr=self._lr,
      momentum=self._mu, weight_decay=weight_decay)
    self._iter = 0
    # global states are the statistics
    self._global_state = {}
    # for decaying learning rate and etc.
    self._lr_factor = 1.0

  def set_lr_factor(self, factor):
    self._lr_factor = factor

  def get_lr_factor(self):
    return self._lr_factor

  def zero_grad(self):
    self._optimizer.zero_grad()

  def zero_debias_factor(self):
    return 1.0 - self._beta ** (self._iter + 1)

  def curvature_range(self):
    global_state = self._global_state
    if self._iter == 0:
      global_state["curv_win"] = torch.FloatTensor(self._curv_win_width, 1).zero_()
    curv_win = global_state["curv_win"]
    grad_norm_squared = self._global_state["grad_norm_squared"]
    curv_win[self._iter % self._curv_win_width] = grad_norm_squared
    valid_end = min(self._curv_win_width, self._iter + 1)
    beta = self._beta
    if self._iter == 0:
      global_state["h_min_avg"] = 0.0
      global_state["h_max_avg"] = 0.0
      self._h_min = 0.0
      self._h_max = 0.0
    global_state["h_min_avg"] = \
      global_state["h_min_avg"] * beta + (1 - beta) * torch.min(curv_win[:valid_end]).item()
    global_state["h_max_avg"] = \
      global_state["h_max_avg"] * beta + (1 - beta) * torch.max(curv_win[:valid_end]).item()
    debias_factor = self.zero_debias_factor() if self._zero_debias else 1.0
    self._h_min = global_state["h_min_avg"] / debias_factor
    self._h_max = global_state["h_max_avg"] / debias_factor

  def grad_variance(self):
    global_state = self._global_state
    beta = self._beta
    self._grad_var = 0.0
    for group in self._optimizer.param_groups:
      for p in group['params']:
        if p.grad is None:
          continue
        grad = p.grad.data
        state = self._optimizer.state[p]
        if self._iter == 0:
          state["grad_avg"] = grad.new().resize_as_(grad).zero_()
        state["grad_avg"].mul_(beta).add_(grad, alpha=1 - beta)
        self._grad_var += torch.sum(state["grad_avg"] * state["grad_avg"]).item()
    debias_factor = self.zero_debias_factor() if self._zero_debias else 1.0
    self._grad_var /= -(debias_factor**2)
    self._grad_var += global_state['grad_norm_squared_avg'] / debias_factor

  def dist_to_opt(self):
    global_state = self._global_state
    beta = self._beta
    if self._iter == 0:
      global_state["grad_norm_avg"] = 0.0
      global_state["dist_to_opt_avg"] = 0.0
    global_state["grad_norm_avg"] = \
      global_state["grad_norm_avg"] * beta + (1 - beta) * math.sqrt(global_state["grad_norm_squared"])
    global_state["dist_to_opt_avg"] = \
      global_state["dist_to_opt_avg"] * beta \
      + (1 - beta) * global_state["grad_norm_avg"] / global_state['grad_norm_squared_avg']
    debias_factor = self.zero_debias_factor() if self._zero_debias else 1.0
    self._dist_to_opt = global_state["dist_to_opt_avg"] / debias_factor

  def after_apply(self):
    # compute running average of gradient and norm of gradient
    beta = self._beta
    global_state = self._global_state
    if self._iter == 0:
      global_state["grad_norm_squared_avg"] = 0.0
    global_state["grad_norm_squared"] = 0.0
    for group in self._optimizer.param_groups:
      for p in group['params']:
        if p.grad is None:
          continue
        grad = p.grad.data
        global_state['grad_norm_squared'] += torch.sum(grad * grad).item()
    global_state['grad_norm_squared_avg'] = \
      global_state['grad_norm_squared_avg'] * beta + (1 - beta) * global_state['grad_norm_squared']
    self.curvature_range()
    self.grad_variance()
    self.dist_to_opt()
    if self._iter > 0:
      self.get_mu()
      self.get_lr()
      self._lr = beta * self._lr + (1 - beta) * self._lr_t
      self._mu = beta * self._mu + (1 - beta) * self._mu_t

  def get_lr(self):
    self._lr_t = (1.0 - math.sqrt(self._mu_t))**2 / self._h_min

  def get_mu(self):
    coef = [-1.0, 3.0, 0.0, 1.0]
    coef[2] = -(3 + self._dist_to_opt**2 * self._h_min**2 / 2 / self._grad_var)
    roots = np.roots(coef)
    root = roots[np.logical_and(np.logical_and(np.real(roots) > 0.0,
      np.real(roots) < 1.0), np.imag(roots) < 1e-5)]
    assert root.size == 1
    dr = self._h_max / self._h_min
    self._mu_t = max(np.real(root)[0]**2, ((np.sqrt(dr) - 1) / (np.sqrt(dr) + 1))**2)

  def update_hyper_param(self):
    for group in self._optimizer.param_groups:
      group['momentum'] = self._mu
      group['lr'] = self._lr * self._lr_factor

  def step(self):
    if self._clip_thresh != None:
      torch.nn.utils.clip_grad_norm_(self._var_list, self._clip_thresh)
    # apply update
    self._optimizer.step()
    # after appply
    self.after_apply()
    # update learning rate and momentum
    self.update_hyper_param()
    self._iter += 1


parser = argparse.ArgumentParser(description='Log-mel frame autoencoder')
parser.add_argument('--lr', default=1.0, type=float, help='learning rate')
parser.add_argument('--mu', default=0.0, type=float, help='momentum')
parser.add_argument('--clip_thresh', default=1.0, type=float, help='gradient clipping threshold')
parser.add_argument('--opt_method', type=str, default="YF")
parser.add_argument('--epochs', default=4, type=int)
parser.add_argument('--batch_size', default=64, type=int)
parser.add_argument('--logdir', type=str, default=os.path.join(tempfile.gettempdir(), "yf_mel_ae"))
args = parser.parse_args()

torch.manual_seed(1)
np.random.seed(1)


def synth_logmel(n_frames, n_mels=64, n_sources=8):
  # frames in dB, as written by the feature extractor (no per-bin normalisation)
  envelope = np.linspace(-25.0, -60.0, n_mels)
  templates = np.abs(np.random.randn(n_sources, n_mels)) * 6.0
  activations = np.random.rand(n_frames, n_sources) ** 3
  frames = envelope + activations.dot(templates) + np.random.randn(n_frames, n_mels) * 2.0
  frames = np.clip(frames, -80.0, 0.0)
  # cepstral-style mean normalisation per mel bin (variance left as is)
  return (frames - frames.mean(axis=0)).astype(np.float32)


print('==> Preparing data..')
frames = torch.from_numpy(synth_logmel(4096))
n_batches = frames.size(0) // args.batch_size

print('==> Building model..')
net = nn.Sequential(
  nn.Linear(64, 128), nn.ReLU(),
  nn.Linear(128, 16), nn.ReLU(),
  nn.Linear(16, 128), nn.ReLU(),
  nn.Linear(128, 64),
)
criterion = nn.MSELoss()

if args.opt_method == "SGD":
  optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
elif args.opt_method == "YF":
  print("using YF")
  optimizer = YFOptimizer(net.parameters(), lr=args.lr, mu=args.mu, clip_thresh=args.clip_thresh)


def train(epoch):
  print('\nEpoch: %d' % epoch)
  net.train()
  loss_list, lr_list, mu_list = [], [], []
  perm = torch.randperm(frames.size(0))
  for batch_idx in range(n_batches):
    inputs = frames[perm[batch_idx * args.batch_size:(batch_idx + 1) * args.batch_size]]
    optimizer.zero_grad()
    outputs = net(inputs)
    loss = criterion(outputs, inputs)
    loss.backward()
    loss_list.append(loss.item())
    if batch_idx < 5 or batch_idx % 16 == 0:
      print('[%d, %3d] loss: %.4g' % (epoch, batch_idx, loss.item()))
    optimizer.step()
    if args.opt_method == "YF":
      lr_list.append(optimizer._optimizer.param_groups[0]['lr'])
      mu_list.append(optimizer._optimizer.param_groups[0]['momentum'])
  print('train loss %.4f | lr %.4g | mu %.4g' % (np.mean(loss_list), lr_list[-1] if lr_list else args.lr,
                                              mu_list[-1] if mu_list else 0.0))
  return loss_list, lr_list, mu_list


if not os.path.isdir(args.logdir):
  os.makedirs(args.logdir)
loss_list, lr_list, mu_list = [], [], []
for epoch in range(args.epochs):
  loss_epoch, lr_epoch, mu_epoch = train(epoch)
  loss_list += loss_epoch
  lr_list += lr_epoch
  mu_list += mu_epoch
  with open(args.logdir + "/loss.txt", "wb") as f:
    np.savetxt(f, np.array(loss_list))
  with open(args.logdir + "/lr.txt", "wb") as f:
    np.savetxt(f, np.array(lr_list))
  with open(args.logdir + "/mu.txt", "wb") as f:
    np.savetxt(f, np.array(mu_list))
