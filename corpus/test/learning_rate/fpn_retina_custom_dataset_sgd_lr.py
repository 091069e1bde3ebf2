"""FPN/RetinaNet-style detector on a custom dataset: SGD learning rate too high -> NaN loss.

Reproduces https://github.com/gurkirt/FPN.pytorch1.0/issues/7 ("Why do I train my
dataset with a loss of NaN for each iteration?").  The repo trains a ResNet+FPN
single-stage detector with plain SGD (momentum 0.9, weight decay 5e-4) and a
MultiStepLR schedule; the learning rate comes from the argparse default of
train.py.  The reporter trained on their own data with a learning rate too large
for it: the SGD+momentum updates overshoot, the regression/classification head
weights grow step after step until the outputs overflow, and the printed
loc-loss / cls-loss become inf and then nan for every following iteration.

Fix (maintainer, gurkirt): "Reduce the learning rate and try again." In this
script that is the --lr default (0.2 -> 0.001, the repo's own default).
"""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import MultiStepLR

parser = argparse.ArgumentParser(description='Retinet with FPN as base with resnet Training')
parser.add_argument('--version', default='kmeansAR3', help='layer')
parser.add_argument('--basenet', default='resnet-tiny', help='base model')
parser.add_argument('--dataset', default='custom', help='dataset')
parser.add_argument('--input_dim', default=48, type=int, help='Input Size')
parser.add_argument('--batch_size', default=8, type=int, help='Batch size for training')
parser.add_argument('--max_iter', default=60, type=int, help='Number of training iterations')
parser.add_argument('--lr', '--learning-rate', default=0.2, type=float, help='initial learning rate')
parser.add_argument('--momentum', default=0.9, type=float, help='momentum')
parser.add_argument('--step_values', default='40,50', type=str, help='Change the lr @')
parser.add_argument('--weight_decay', default=5e-4, type=float, help='Weight decay for SGD')
parser.add_argument('--gamma', default=0.1, type=float, help='Gamma update for SGD')
parser.add_argument('--man_seed', default=1, type=int, help='manualseed for reproduction')
args = parser.parse_args()

np.random.seed(args.man_seed)
torch.manual_seed(args.man_seed)
torch.set_num_threads(1)


def set_bn_eval(m):
    if m.__class__.__name__.find('BatchNorm') != -1:
        m.eval()


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.down(x))


class FPN(nn.Module):
    def __init__(self, num_classes, num_anchors=3, head_size=32):
        super().__init__()
        self.base_net = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer2 = BasicBlock(16, 32, 2)    # 1/4
        self.layer3 = BasicBlock(32, 64, 2)    # 1/8
        self.lat2 = nn.Conv2d(32, head_size, 1)
        self.lat3 = nn.Conv2d(64, head_size, 1)
        self.num_classes = num_classes
        self.reg_head = nn.Sequential(nn.Conv2d(head_size, head_size, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(head_size, num_anchors * 4, 3, padding=1))
        self.cls_head = nn.Sequential(nn.Conv2d(head_size, head_size, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(head_size, num_anchors * num_classes, 3, padding=1))

    def forward(self, x):
        c2 = self.layer2(self.base_net(x))
        c3 = self.layer3(c2)
        p3 = self.lat3(c3)
        p2 = self.lat2(c2) + F.interpolate(p3, scale_factor=2, mode='nearest')
        reg, cls = [], []
        for p in (p2, p3):
            reg.append(self.reg_head(p).permute(0, 2, 3, 1).reshape(x.size(0), -1, 4))
            cls.append(self.cls_head(p).permute(0, 2, 3, 1).reshape(x.size(0), -1, self.num_classes))
        return torch.cat(reg, 1), torch.cat(cls, 1)


class MultiBoxLoss(nn.Module):
    """Smooth-L1 on positive anchors + cross-entropy with 3:1 hard negative mining."""

    def forward(self, cls_out, reg_out, reg_targets, labels):
        pos = labels > 0
        num_pos = pos.sum().clamp(min=1).float()
        loss_l = F.smooth_l1_loss(reg_out[pos], reg_targets[pos], reduction='sum') / num_pos
        ce = F.cross_entropy(cls_out.reshape(-1, cls_out.size(-1)), labels.reshape(-1),
                             reduction='none').view(labels.shape)
        with torch.no_grad():
            mining = ce.clone()
            mining[pos] = 0
            _, idx = mining.sort(1, descending=True)
            _, rank = idx.sort(1)
            neg = rank < (3 * pos.sum(1, keepdim=True))
        loss_c = ce[pos | neg].sum() / num_pos
        return loss_l, loss_c


def make_batch(gen, bs, dim, num_anchors_total, num_classes):
    """Synthetic custom dataset: images plus anchor-level targets already matched."""
    images = torch.randn(bs, 3, dim, dim, generator=gen)
    labels = torch.zeros(bs, num_anchors_total, dtype=torch.long)
    pos = torch.rand(bs, num_anchors_total, generator=gen) < 0.04
    labels[pos] = torch.randint(1, num_classes, (int(pos.sum()),), generator=gen)
    reg_targets = torch.randn(bs, num_anchors_total, 4, generator=gen) * 2.0
    # objects are brighter in the first channel where anchors are positive
    images[:, 0] += 0.5 * pos.float().mean(1).view(bs, 1, 1)
    return images, reg_targets, labels


def main():
    args.step_values = [int(v) for v in args.step_values.split(',')]
    args.print_step = 5
    args.num_classes = 6
    net = FPN(args.num_classes)
    with torch.no_grad():
        r, _ = net(torch.zeros(1, 3, args.input_dim, args.input_dim))
    num_anchors_total = r.size(1)

    optimizer = optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    criterion = MultiBoxLoss()
    scheduler = MultiStepLR(optimizer, milestones=args.step_values, gamma=args.gamma)

    net.train()
    net.base_net.apply(set_bn_eval)
    gen = torch.Generator().manual_seed(args.man_seed)
    start = time.perf_counter()
    for iteration in range(1, args.max_iter + 1):
        images, reg_t, labels = make_batch(gen, args.batch_size, args.input_dim, num_anchors_total, args.num_classes)
        reg_out, cls_out = net(images)
        optimizer.zero_grad()
        loss_l, loss_c = criterion(cls_out, reg_out, reg_t, labels)
        loss = loss_l + loss_c
        loss.backward()
        optimizer.step()
        scheduler.step()
        if iteration % args.print_step == 0:
            print('Itration {:06d}/{:06d} loc-loss {:.4f} cls-loss {:.4f} average-loss {:.4f} '
                  'lr {:.5f} Timer {:0.2f}'.format(iteration, args.max_iter, loss_l.item(), loss_c.item(),
                                                   loss.item() / 2.0, optimizer.param_groups[0]['lr'],
                                                   time.perf_counter() - start))


if __name__ == '__main__':
    main()
