"""SSD-style single-shot detector trained with batch_size=1 at the default SGD learning rate.

Reproduces amdegroot/ssd.pytorch issue #275 ("Loss is nan when using default configs"):
with the default lr 1e-3 (SGD, momentum 0.9) and batch_size lowered to 1 the loss climbs
(3.3 -> 14 -> 20 -> 3e10) and is nan from iteration ~60 on.  Batch size 1 gives very noisy
gradients, and the L2Norm(scale=20) on the conv4_3 source makes them larger still, so the
step the default lr takes is too big.

Report: https://github.com/amdegroot/ssd.pytorch/issues/275
Fix: a smaller learning rate (the reporter: "Solved this problem by using a small learning
rate"; 1e-4 here), or a larger batch with the lr scaled to it.
"""
import argparse
import itertools
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.nn.init as init
from torch.utils.data import DataLoader, Dataset

voc_mini = {
    "num_classes": 4,  # background + 3 shapes
    "min_dim": 64,
    "feature_maps": [8, 4],
    "steps": [8, 16],
    "min_sizes": [12, 28],
    "max_sizes": [28, 48],
    "aspect_ratios": [[2], [2]],
    "variance": [0.1, 0.2],
    "lr_steps": (800, 1000),
    "max_iter": 1200,
}


# ----------------------------------------------------------------------------- data
class ShapesDetection(Dataset):
    """Synthetic stand-in for VOCDetection: 64x64 images with 1-3 coloured shapes."""

    def __init__(self, n_images=400, size=64, seed=0):
        rng = np.random.RandomState(seed)
        self.items = []
        for _ in range(n_images):
            img = rng.uniform(0, 60, (3, size, size)).astype(np.float32)
            boxes, labels = [], []
            for _ in range(rng.randint(1, 4)):
                w, h = rng.randint(10, 36, 2)
                x0, y0 = rng.randint(0, size - w), rng.randint(0, size - h)
                cls = rng.randint(0, 3)
                color = np.zeros(3, np.float32)
                color[cls] = 200.0
                img[:, y0:y0 + h, x0:x0 + w] = color[:, None, None] + rng.normal(0, 10, (3, h, w))
                boxes.append([x0 / size, y0 / size, (x0 + w) / size, (y0 + h) / size])
                labels.append(cls)
            # BaseTransform: subtract the VGG mean, keep the 0..255 range
            img -= np.array([104, 117, 123], np.float32)[:, None, None]
            target = np.hstack([np.array(boxes, np.float32), np.array(labels, np.float32)[:, None]])
            self.items.append((img, target))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        img, target = self.items[i]
        return torch.from_numpy(img), torch.from_numpy(target)


def detection_collate(batch):
    imgs, targets = zip(*batch)
    return torch.stack(imgs, 0), list(targets)


# ----------------------------------------------------------------------------- box utils
class PriorBox:
    def __init__(self, cfg):
        self.cfg = cfg

    def forward(self):
        cfg, mean = self.cfg, []
        for k, f in enumerate(cfg["feature_maps"]):
            for i, j in itertools.product(range(f), repeat=2):
                f_k = cfg["min_dim"] / cfg["steps"][k]
                cx, cy = (j + 0.5) / f_k, (i + 0.5) / f_k
                s_k = cfg["min_sizes"][k] / cfg["min_dim"]
                mean += [cx, cy, s_k, s_k]
                s_k_prime = math.sqrt(s_k * (cfg["max_sizes"][k] / cfg["min_dim"]))
                mean += [cx, cy, s_k_prime, s_k_prime]
                for ar in cfg["aspect_ratios"][k]:
                    mean += [cx, cy, s_k * math.sqrt(ar), s_k / math.sqrt(ar)]
                    mean += [cx, cy, s_k / math.sqrt(ar), s_k * math.sqrt(ar)]
        return torch.tensor(mean).view(-1, 4).clamp_(0, 1)


def point_form(boxes):
    return torch.cat((boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2), 1)


def jaccard(box_a, box_b):
    max_xy = torch.min(box_a[:, None, 2:], box_b[None, :, 2:])
    min_xy = torch.max(box_a[:, None, :2], box_b[None, :, :2])
    inter = (max_xy - min_xy).clamp(min=0).prod(2)
    area_a = ((box_a[:, 2] - box_a[:, 0]) * (box_a[:, 3] - box_a[:, 1]))[:, None]
    area_b = ((box_b[:, 2] - box_b[:, 0]) * (box_b[:, 3] - box_b[:, 1]))[None, :]
    return inter / (area_a + area_b - inter)


def encode(matched, priors, variances):
    g_cxcy = (matched[:, :2] + matched[:, 2:]) / 2 - priors[:, :2]
    g_cxcy /= variances[0] * priors[:, 2:]
    g_wh = (matched[:, 2:] - matched[:, :2]) / priors[:, 2:]
    g_wh = torch.log(g_wh) / variances[1]
    return torch.cat([g_cxcy, g_wh], 1)


def match(threshold, truths, priors, variances, labels):
    overlaps = jaccard(truths, point_form(priors))
    best_prior_idx = overlaps.max(1)[1]
    best_truth_overlap, best_truth_idx = overlaps.max(0)
    best_truth_overlap.index_fill_(0, best_prior_idx, 2)
    for j in range(best_prior_idx.size(0)):
        best_truth_idx[best_prior_idx[j]] = j
    conf = labels[best_truth_idx] + 1
    conf[best_truth_overlap < threshold] = 0
    return encode(truths[best_truth_idx], priors, variances), conf


def log_sum_exp(x):
    x_max = x.max()
    return torch.log(torch.sum(torch.exp(x - x_max), 1, keepdim=True)) + x_max


class MultiBoxLoss(nn.Module):
    def __init__(self, num_classes, overlap_thresh=0.5, neg_pos=3, variance=(0.1, 0.2)):
        super().__init__()
        self.num_classes, self.threshold, self.negpos_ratio = num_classes, overlap_thresh, neg_pos
        self.variance = variance

    def forward(self, predictions, targets):
        loc_data, conf_data, priors = predictions
        num, num_priors = loc_data.size(0), priors.size(0)
        loc_t = torch.zeros(num, num_priors, 4)
        conf_t = torch.zeros(num, num_priors, dtype=torch.long)
        for idx in range(num):
            loc_t[idx], conf_t[idx] = match(self.threshold, targets[idx][:, :-1], priors,
                                             self.variance, targets[idx][:, -1].long())
        pos = conf_t > 0
        loss_l = F.smooth_l1_loss(loc_data[pos], loc_t[pos], reduction="sum")
        batch_conf = conf_data.view(-1, self.num_classes)
        loss_c = log_sum_exp(batch_conf) - batch_conf.gather(1, conf_t.view(-1, 1))
        loss_c = loss_c.view(num, -1)
        loss_c[pos] = 0
        _, loss_idx = loss_c.sort(1, descending=True)
        _, idx_rank = loss_idx.sort(1)
        num_pos = pos.long().sum(1, keepdim=True)
        num_neg = torch.clamp(self.negpos_ratio * num_pos, max=pos.size(1) - 1)
        neg = idx_rank < num_neg.expand_as(idx_rank)
        sel = (pos | neg)
        loss_c = F.cross_entropy(conf_data[sel], conf_t[sel], reduction="sum")
        N = num_pos.sum().float()
        return loss_l / N, loss_c / N


# ----------------------------------------------------------------------------- model
class L2Norm(nn.Module):
    def __init__(self, n_channels, scale):
        super().__init__()
        self.weight = nn.Parameter(torch.full((n_channels,), float(scale)))
        self.eps = 1e-10

    def forward(self, x):
        norm = x.pow(2).sum(dim=1, keepdim=True).sqrt() + self.eps
        return self.weight[None, :, None, None] * torch.div(x, norm)


def vgg(cfg, in_channels=3):
    layers = []
    for v in cfg:
        if v == "M":
            layers += [nn.MaxPool2d(2, 2)]
        else:
            layers += [nn.Conv2d(in_channels, v, 3, padding=1), nn.ReLU(inplace=True)]
            in_channels = v
    return layers


class SSD(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.num_classes = cfg["num_classes"]
        self.priors = PriorBox(cfg).forward()
        self.vgg = nn.ModuleList(vgg([16, "M", 32, "M", 64, 64, "M"]))  # -> 8x8 "conv4_3"
        self.L2Norm = L2Norm(64, 20)
        self.extras = nn.ModuleList([nn.Conv2d(64, 32, 1), nn.Conv2d(32, 64, 3, stride=2, padding=1)])
        mbox = [4, 4]
        self.loc = nn.ModuleList([nn.Conv2d(64, m * 4, 3, padding=1) for m in mbox])
        self.conf = nn.ModuleList([nn.Conv2d(64, m * self.num_classes, 3, padding=1) for m in mbox])

    def forward(self, x):
        sources = []
        for layer in self.vgg:
            x = layer(x)
        sources.append(self.L2Norm(x))
        for k, v in enumerate(self.extras):
            x = F.relu(v(x), inplace=True)
        sources.append(x)
        loc, conf = [], []
        for x, l, c in zip(sources, self.loc, self.conf):
            loc.append(l(x).permute(0, 2, 3, 1).contiguous())
            conf.append(c(x).permute(0, 2, 3, 1).contiguous())
        loc = torch.cat([o.view(o.size(0), -1) for o in loc], 1)
        conf = torch.cat([o.view(o.size(0), -1) for o in conf], 1)
        return loc.view(loc.size(0), -1, 4), conf.view(conf.size(0), -1, self.num_classes), self.priors


def xavier(param):
    init.xavier_uniform_(param)


def weights_init(m):
    if isinstance(m, nn.Conv2d):
        xavier(m.weight.data)
        m.bias.data.zero_()


# ----------------------------------------------------------------------------- train
parser = argparse.ArgumentParser(description="Single Shot MultiBox Detector Training")
parser.add_argument("--batch_size", default=1, type=int, help="Batch size for training")
parser.add_argument("--lr", "--learning-rate", default=1e-3, type=float, help="initial learning rate")
parser.add_argument("--momentum", default=0.9, type=float, help="Momentum value for optim")
parser.add_argument("--weight_decay", default=5e-4, type=float, help="Weight decay for SGD")
parser.add_argument("--gamma", default=0.1, type=float, help="Gamma update for SGD")
parser.add_argument("--max_iter", default=300, type=int)
args = parser.parse_args()


def adjust_learning_rate(optimizer, gamma, step):
    lr = args.lr * (gamma ** step)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr


def train():
    torch.manual_seed(0)
    cfg = voc_mini
    dataset = ShapesDetection()
    ssd_net = SSD(cfg)
    ssd_net.vgg.apply(weights_init)
    ssd_net.extras.apply(weights_init)
    ssd_net.loc.apply(weights_init)
    ssd_net.conf.apply(weights_init)

    optimizer = torch.optim.SGD(ssd_net.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    criterion = MultiBoxLoss(cfg["num_classes"], 0.5, 3, cfg["variance"])
    ssd_net.train()
    print("Loading the dataset...")
    print("Training SSD on:", "ShapesDetection", "batch_size", args.batch_size, "lr", args.lr)

    step_index = 0
    data_loader = DataLoader(dataset, args.batch_size, shuffle=True, collate_fn=detection_collate,
                             generator=torch.Generator().manual_seed(0))
    batch_iterator = iter(data_loader)
    for iteration in range(0, args.max_iter):
        if iteration in cfg["lr_steps"]:
            step_index += 1
            adjust_learning_rate(optimizer, args.gamma, step_index)
        try:
            images, targets = next(batch_iterator)
        except StopIteration:
            batch_iterator = iter(data_loader)
            images, targets = next(batch_iterator)
        t0 = time.time()
        out = ssd_net(images)
        optimizer.zero_grad()
        loss_l, loss_c = criterion(out, targets)
        loss = loss_l + loss_c
        loss.backward()
        optimizer.step()
        t1 = time.time()
        if iteration % 10 == 0:
            print("iter " + repr(iteration) + " || Loss: %.4f ||" % (loss.item()),
                  "timer: %.4f sec." % (t1 - t0))


if __name__ == "__main__":
    train()
