"""IIM crowd localization: the threshold encoder (BinarizedModule) learning rate is too high.

Reproduces https://github.com/taohan10200/IIM/issues/7 ("NAN in training process").
IIM trains a crowd locator in two parameter groups of one Adam optimizer: the
Extractor (VGG16_FPN / HRNet) at cfg.LR_BASE_NET and the Binarized Module (the
threshold encoder) at cfg.LR_BM_NET.  The threshold is
    sig(T(f) * 10),  sig(x) = 1 / (2 + exp(-x)) + 0.2     (compressedSigmoid)
and the straight-through BinarizedF sends -grad_output back to the threshold.
Head pixels whose predicted score stays under the floor of the threshold (0.2)
push the threshold down at every step, so with a too large LR_BM_NET Adam drives
the pre-activation of the compressed sigmoid far negative; once 10*T < -88,
exp(-x) overflows to inf in float32: the forward value is still 0.2, but the
backward of 1/(2+exp(-x)) is 0 * inf = NaN.  The NaN gradient reaches the
threshold encoder weights through Adam and t-max / t-min print nan.

Fix (maintainer, taohan10200): "lower the learning rate of the threshold encoder
in config.py" (__C.LR_BM_NET 1e-6 -> 1e-7); the reporter confirmed it works.
In this scaled-down run (few hundred iterations instead of 600 epochs) the
values are 1e-2 (sick) and 1e-3 (fixed), the same 10x reduction.
"""
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.autograd import Function


class edict(dict):
    """Minimal stand-in for easydict.EasyDict."""
    __getattr__ = dict.__getitem__
    __setattr__ = dict.__setitem__


# ------------------------------ config.py ------------------------------
__C = edict()
cfg = __C
__C.SEED = 3035
__C.DATASET = 'SYN_NWPU'
__C.NET = 'VGG16_FPN'
__C.OPT = 'Adam'
if __C.OPT == 'Adam':
    __C.LR_BASE_NET = 1e-3   # learning rate of the extractor
    __C.LR_BM_NET = 1e-2     # learning rate of the threshold encoder
__C.MAX_EPOCH = 5
__C.ITERS_PER_EPOCH = 30
__C.PRINT_FREQ = 10
__C.TRAIN_SIZE = (32, 32)
__C.TRAIN_BATCH_SIZE = 4


# ------------------------------ model/PBM.py ---------------------------
class BinarizedF(Function):
    @staticmethod
    def forward(ctx, input, threshold):
        ctx.save_for_backward(input, threshold)
        a = torch.ones_like(input)
        b = torch.zeros_like(input)
        return torch.where(input >= threshold, a, b)

    @staticmethod
    def backward(ctx, grad_output):
        grad_input = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_input = 0.2 * grad_output
        if ctx.needs_input_grad[1]:
            grad_weight = -grad_output
        return grad_input, grad_weight


class compressedSigmoid(nn.Module):
    def __init__(self, para=2.0, bias=0.2):
        super().__init__()
        self.para = para
        self.bias = bias

    def forward(self, x):
        return 1. / (self.para + torch.exp(-x)) + self.bias


class BinarizedModule(nn.Module):
    def __init__(self, input_channels=64):
        super().__init__()
        self.Threshold_Module = nn.Sequential(
            nn.Conv2d(input_channels, 64, kernel_size=3, stride=1, padding=1, bias=False),
            nn.PReLU(),
            nn.Conv2d(64, 32, kernel_size=3, stride=1, padding=1, bias=False),
            nn.PReLU(),
            nn.Conv2d(32, 16, kernel_size=3, stride=1, padding=1, bias=False),
            nn.PReLU(),
            nn.AvgPool2d(5, stride=1, padding=2),
            nn.Conv2d(16, 1, kernel_size=1, stride=1, padding=0, bias=False),
            nn.AvgPool2d(5, stride=1, padding=2),
        )
        self.sig = compressedSigmoid()

    def forward(self, feature, pred_map):
        p = F.interpolate(pred_map.detach(), scale_factor=0.125)
        f = F.interpolate(feature.detach(), scale_factor=0.5)
        f = f * p
        threshold = self.Threshold_Module(f)
        threshold = self.sig(threshold * 10.)
        threshold = F.interpolate(threshold, scale_factor=8)
        binar_map = BinarizedF.apply(pred_map, threshold)
        return threshold, binar_map


# ------------------------------ model/VGG/VGG16_FPN.py (tiny) ----------
class TinyFPN(nn.Module):
    def __init__(self, ch=64):
        super().__init__()
        self.stage1 = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
                                    nn.MaxPool2d(2))
        self.stage2 = nn.Sequential(nn.Conv2d(32, ch, 3, padding=1), nn.BatchNorm2d(ch), nn.ReLU(inplace=True),
                                    nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Conv2d(ch, 32, 3, padding=1), nn.ReLU(inplace=True),
                                  nn.ConvTranspose2d(32, 16, 4, stride=4), nn.ReLU(inplace=True),
                                  nn.Conv2d(16, 1, 1))

    def forward(self, x):
        feature = self.stage2(self.stage1(x))      # 1/4 resolution
        pre_map = self.head(feature)               # full resolution
        return feature, pre_map


class Crowd_locator(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.Extractor = TinyFPN(ch=64)
        self.Binar = BinarizedModule(input_channels=64)

    def forward(self, img, mask_gt):
        feature, pre_map = self.Extractor(img)
        threshold_matrix, binar_map = self.Binar(feature, pre_map)
        self.binar_map_loss = torch.abs(binar_map - mask_gt).mean()
        self.head_map_loss = F.mse_loss(pre_map, mask_gt)
        return threshold_matrix, pre_map, binar_map


# ------------------------------ synthetic crowd data -------------------
def make_batch(gen, bs, size):
    h, w = size
    img = torch.randn(bs, 3, h, w, generator=gen) * 0.2
    gt = torch.zeros(bs, 1, h, w)
    for b in range(bs):
        n = int(torch.randint(5, 25, (1,), generator=gen))
        ys = torch.randint(2, h - 3, (n,), generator=gen)
        xs = torch.randint(2, w - 3, (n,), generator=gen)
        for y, x in zip(ys.tolist(), xs.tolist()):
            gt[b, 0, y - 1:y + 2, x - 1:x + 2] = 1.0          # independent-instance head mask
            img[b, :, y - 2:y + 3, x - 2:x + 3] += 0.8           # a bright blob per head
    return img, gt


def adjust_learning_rate(optimizer, base_lr1, base_lr2, max_iters, cur_iters, power=0.9):
    lr1 = base_lr1 * ((1 - float(cur_iters) / max_iters) ** power)
    lr2 = base_lr2 * ((1 - float(cur_iters) / max_iters) ** power)
    optimizer.param_groups[0]['lr'] = lr1
    optimizer.param_groups[1]['lr'] = lr2
    return lr1, lr2


def main():
    torch.set_num_threads(1)
    random.seed(cfg.SEED)
    np.random.seed(cfg.SEED)
    torch.manual_seed(cfg.SEED)
    gen = torch.Generator().manual_seed(cfg.SEED)

    net = Crowd_locator(cfg)
    optimizer = optim.Adam([{'params': net.Extractor.parameters(), 'lr': cfg.LR_BASE_NET, 'weight_decay': 1e-5},
                            {'params': net.Binar.parameters(), 'lr': cfg.LR_BM_NET}])
    num_iters = cfg.MAX_EPOCH * cfg.ITERS_PER_EPOCH
    it = 0
    net.train()
    for epoch in range(cfg.MAX_EPOCH):
        for i in range(cfg.ITERS_PER_EPOCH):
            img, gt_map = make_batch(gen, cfg.TRAIN_BATCH_SIZE, cfg.TRAIN_SIZE)
            optimizer.zero_grad()
            threshold_matrix, pre_map, binar_map = net(img, gt_map)
            head_map_loss, binar_map_loss = net.head_map_loss, net.binar_map_loss
            all_loss = head_map_loss + binar_map_loss
            all_loss.backward()
            optimizer.step()
            it += 1
            lr1, lr2 = adjust_learning_rate(optimizer, cfg.LR_BASE_NET, cfg.LR_BM_NET, num_iters, it)
            if (i + 1) % cfg.PRINT_FREQ == 0:
                print('[ep %d][it %d][loss %.4f][binar %.4f][lr1 %.6f][lr2 %.6f]'
                      % (epoch + 1, i + 1, head_map_loss.item(), binar_map_loss.item(), lr1, lr2))
                print('       [cnt: gt: %.1f pred: %.2f t-max: %.3f t-min: %.3f]'
                      % (gt_map.sum().item(), pre_map.sum().item(),
                         threshold_matrix.max().item(), threshold_matrix.min().item()))


if __name__ == '__main__':
    main()
