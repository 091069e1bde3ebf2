"""Person re-id with QAConv + graph sampling (QAConv-GS) in the style of ShengcaiLiao/QAConv
(main_gs.py / reid/trainers*.py): a ResNet-like feature-map backbone with a 1x1 neck, the QAConv
matcher that correlates every location of one feature map with every location of another and
max-pools the scores into an fc, a focal-weighted binary pairwise matching loss summed over the
gallery, PK batches for the first epoch then graph-sampler batches (each class batched with its
nearest classes under the current matcher), SGD (momentum 0.9, nesterov, weight decay 5e-4)
with the backbone at 0.1x the learning rate, StepLR.

Setting: the training loop is the plain Trainer (zero_grad, backward, step); the gradient
clipping of QAConv's trainers_clip.py (clip_grad_norm_ on the model and on the matcher right
after loss.backward(), --clip_value 512 for their ResNet-50) is not there.  Synthetic
"pedestrians": 48x16 images from per-identity colour templates, identities in look-alike pairs
that the graph sampler puts in the same batch.

Bug: the matching score is a sum of feature-map correlations (quadratic in the feature scale)
and the loss is summed over the gallery, so when the graph sampler starts serving hard batches
(epoch 2) the gradient norm jumps: 4 -> 15 -> 73 -> 580 -> 7e4 -> 1e9 -> inf within six
iterations.  Without clipping each SGD step moves the neck and matcher weights by that much, the
next scores are larger still, the loss goes 3.4 -> 17 -> 103 -> 3e4 -> 4e8 -> 6e26, the
gradients overflow to inf in backward and the weights and the loss become nan (epoch 3).  The
maintainer on training QAConv-GS without gradient clipping: "an increasing loss, until even NaN".

Fix (QAConv-GS, reid/trainers_clip.py): clip the gradient norm right after loss.backward(),
clip_grad_norm_(self.model.parameters(), clip_value) and the same for the criterion (matcher)
parameters.  With the clip (32 at this toy's scale) the same script trains with finite loss.

Report: https://github.com/ShengcaiLiao/QAConv/issues/12
"""
from __future__ import print_function, absolute_import
import argparse
import math
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.lr_scheduler import StepLR


class AverageMeter(object):
    def __init__(self):
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


# ----------------------------------------------------------------------------- reid/models
class ResMap(nn.Module):
    def __init__(self, neck=64):
        super(ResMap, self).__init__()
        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                                 nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
        self.base = nn.Sequential(block(3, 32), block(32, 64), block(64, 128))
        self.neck = nn.Conv2d(128, neck, kernel_size=1, stride=1, padding=0, bias=False)
        self.num_features = neck

    def forward(self, inputs):
        x = self.base(inputs)
        x = self.neck(x)
        return x


class QAConv(nn.Module):
    def __init__(self, num_features, height, width):
        super(QAConv, self).__init__()
        self.num_features = num_features
        self.height = height
        self.width = width
        self.fc = nn.Linear(self.height * self.width * 2, 1)

    def forward(self, prob_fea, gal_fea=None):
        if gal_fea is None:
            gal_fea = prob_fea
        num_probs, num_gals = prob_fea.size(0), gal_fea.size(0)
        hw = self.height * self.width
        prob_fea = prob_fea.view(num_probs, self.num_features, hw)
        gal_fea = gal_fea.view(num_gals, self.num_features, hw)
        score = torch.einsum('p c s, g c r -> p g r s', prob_fea, gal_fea) / math.sqrt(self.num_features)
        score = torch.cat((score.max(dim=2)[0], score.max(dim=3)[0]), dim=-1)
        score = self.fc(score.view(-1, 2 * hw)).view(num_probs, num_gals)
        return score


class PairwiseMatchingLoss(nn.Module):
    def __init__(self, matcher):
        super(PairwiseMatchingLoss, self).__init__()
        self.matcher = matcher

    def forward(self, feature, target):
        score = self.matcher(feature)
        target1 = target.unsqueeze(1)
        mask = (target1 == target1.t()).float()
        pair_labels = mask
        loss = F.binary_cross_entropy_with_logits(score, pair_labels, reduction='none')
        with torch.no_grad():
            prob = score.sigmoid()
            weight = torch.pow(torch.where(pair_labels > 0, 1 - prob, prob), 2)
        loss = (loss * weight).sum(-1)
        with torch.no_grad():
            min_pos = torch.min(score * mask + (1 - mask) * 1e15, dim=1)[0]
            max_neg = torch.max(score * (1 - mask) - mask * 1e15, dim=1)[0]
            acc = (min_pos > max_neg).float()
        return loss, acc


# ----------------------------------------------------------------------------- data
class SyntheticPersons(object):
    """num_ids identities, look-alike pairs (2k, 2k+1) share most of their template."""

    def __init__(self, num_ids=32, num_imgs=8, height=48, width=16, seed=0):
        rng = np.random.RandomState(seed)
        self.height, self.width = height, width
        templates = []
        for k in range(num_ids // 2):
            base = rng.uniform(-1, 1, size=(3, 6, 1)).repeat(height // 6, 1).repeat(width, 2)
            for j in range(2):
                t = base.copy()
                t[:, (height // 2 + 8 * j):(height // 2 + 8 * j + 8)] += rng.uniform(-0.6, 0.6, size=(3, 1, 1))
                templates.append(t)
        self.images, self.pids = [], []
        for pid, t in enumerate(templates):
            for _ in range(num_imgs):
                img = t * rng.uniform(0.7, 1.3) + 0.25 * rng.randn(*t.shape)
                self.images.append(img.astype(np.float32))
                self.pids.append(pid)
        self.images = torch.from_numpy(np.stack(self.images))
        self.pids = torch.tensor(self.pids)
        self.num_ids = num_ids


class GraphSampler(object):
    """PK batches for the first gs_pre_epochs epochs, afterwards each batch holds a class and its
    nearest classes according to the current model + matcher (hard batches)."""

    def __init__(self, dataset, model, matcher, batch_size, num_instance, gs_pre_epochs, seed=0):
        self.dataset = dataset
        self.model, self.matcher = model, matcher
        self.batch_size, self.num_instance = batch_size, num_instance
        self.gs_pre_epochs = gs_pre_epochs
        self.rng = np.random.RandomState(seed)
        self.index_dic = {}
        for i, pid in enumerate(dataset.pids.tolist()):
            self.index_dic.setdefault(pid, []).append(i)

    def _class_batches(self, epoch):
        ids_per_batch = self.batch_size // self.num_instance
        pids = list(self.index_dic.keys())
        if epoch < self.gs_pre_epochs:
            self.rng.shuffle(pids)
            return [pids[i:i + ids_per_batch] for i in range(0, len(pids), ids_per_batch)]
        # graph sampling: distances between one sample per class
        self.model.eval()
        with torch.no_grad():
            idx = [self.index_dic[p][0] for p in pids]
            fea = self.model(self.dataset.images[idx])
            dist = -self.matcher(fea)
        self.model.train()
        dist.fill_diagonal_(float('inf'))
        topk = torch.argsort(dist, dim=1)[:, :ids_per_batch - 1]
        order = self.rng.permutation(len(pids))
        return [[pids[c]] + [pids[j] for j in topk[c].tolist()] for c in order[: len(pids) // ids_per_batch]]

    def batches(self, epoch):
        for cls in self._class_batches(epoch):
            idx = []
            for p in cls:
                idx += self.rng.choice(self.index_dic[p], self.num_instance, replace=False).tolist()
            yield self.dataset.images[idx], self.dataset.pids[idx]


# ----------------------------------------------------------------------------- reid/trainers.py
class BaseTrainer(object):
    def __init__(self, model, criterion):
        super(BaseTrainer, self).__init__()
        self.model = model
        self.criterion = criterion

    def train(self, epoch, sampler, optimizer):
        self.model.train()
        self.criterion.train()
        losses = AverageMeter()
        precisions = AverageMeter()
        for i, (imgs, pids) in enumerate(sampler.batches(epoch)):
            feature = self.model(imgs)
            loss, acc = self.criterion(feature, pids)
            loss = torch.mean(loss)
            acc = torch.mean(acc)

            losses.update(loss.item(), pids.size(0))
            precisions.update(acc.item(), pids.size(0))

            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            print('Epoch: [{}][{}]. Loss: {:.3f} ({:.3f}). Prec: {:.2%} ({:.2%}).'
                  .format(epoch + 1, i + 1, losses.val, losses.avg, precisions.val, precisions.avg))
        return losses.avg, precisions.avg


def main(args):
    torch.manual_seed(args.seed)
    dataset = SyntheticPersons(num_ids=args.num_ids, height=args.height, width=args.width, seed=args.seed)

    model = ResMap(neck=args.neck)
    hei, wid = args.height // 8, args.width // 8
    matcher = QAConv(model.num_features, hei, wid)
    criterion = PairwiseMatchingLoss(matcher)

    base_param_ids = set(map(id, model.base.parameters()))
    new_params = [p for p in model.parameters() if id(p) not in base_param_ids]
    param_groups = [
        {'params': model.base.parameters(), 'lr': 0.1 * args.lr},
        {'params': new_params, 'lr': args.lr},
        {'params': matcher.parameters(), 'lr': args.lr}]
    optimizer = torch.optim.SGD(param_groups, lr=args.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    lr_scheduler = StepLR(optimizer, step_size=args.step_size, gamma=0.1)

    sampler = GraphSampler(dataset, model, matcher, args.batch_size, args.num_instance, args.gs_pre_epochs, args.seed)
    trainer = Trainer(model, criterion)

    t0 = time.time()
    for epoch in range(args.epochs):
        loss, acc = trainer.train(epoch, sampler, optimizer)
        lr = list(map(lambda group: group['lr'], optimizer.param_groups))
        lr_scheduler.step()
        print('* Finished epoch %d at lr=[%g, %g, %g]. Loss: %.3f. Acc: %.2f%%. Training time: %.0f seconds.\n'
              % (epoch + 1, lr[0], lr[1], lr[2], loss, acc * 100, time.time() - t0))


Trainer = BaseTrainer

if __name__ == '__main__':
    parser = argparse.ArgumentParser(description="QAConv_GS")
    parser.add_argument('-b', '--batch-size', type=int, default=32, help="the batch size, default: 32")
    parser.add_argument('--num_ids', type=int, default=32)
    parser.add_argument('--height', type=int, default=48, help="height of the input image")
    parser.add_argument('--width', type=int, default=16, help="width of the input image")
    parser.add_argument('--neck', type=int, default=64, help="number of channels for the final neck layer")
    parser.add_argument('--lr', type=float, default=0.02,
                        help="Learning rate of the new parameters. For the backbone it is 10 times smaller.")
    parser.add_argument('--epochs', type=int, default=4)
    parser.add_argument('--step_size', type=int, default=10)
    parser.add_argument('--num_instance', type=int, default=4)
    parser.add_argument('--gs_pre_epochs', type=int, default=1)
    parser.add_argument('--seed', type=int, default=0)
    main(parser.parse_args())
