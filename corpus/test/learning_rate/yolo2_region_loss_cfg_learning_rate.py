"""marvis/pytorch-yolo2: YOLOv2 region loss goes nan with ``learning_rate=0.001`` in the cfg.

Reproduces https://github.com/marvis/pytorch-yolo2/issues/87 (the training log shows
``loss: x 1692.9, y 1690.9, w nan, h nan, conf nan, cls nan, total nan``).  pytorch-yolo2 reads
its solver settings from the darknet ``[net]`` section of the cfg file: ``train.py`` does
``learning_rate = float(net_options['learning_rate'])`` and builds
``optim.SGD(model.parameters(), lr=learning_rate/batch_size, momentum=momentum,
weight_decay=decay*batch_size)`` while ``RegionLoss`` *sums* its squared errors over every
anchor of every cell of every image (``nn.MSELoss(size_average=False)``), i.e. the step per
image is ``learning_rate`` on a summed loss.  Darknet itself ramps the rate up with
``burn_in``; pytorch-yolo2's ``adjust_learning_rate`` only applies ``steps``/``scales`` (the
``burn_in`` line is never read), so a cfg with ``learning_rate=0.001`` trains at 0.001 from the
first batch (the reporter's cfg is not in the thread; 0.001 is the rate the answer lowered).
During the first 12800 images ``build_targets`` puts every anchor in ``coord_mask`` with
``tw = th = 0``, so the raw
``w``/``h`` outputs of the linear last conv are fitted by a summed quadratic over all anchors:
at 0.001 SGD with momentum is past the stability limit of that quadratic, ``w``/``h`` oscillate
with growing amplitude (loss_w / loss_h grow by orders of magnitude per batch),
``torch.exp(w) * anchor_w`` in the predicted boxes overflows to inf, ``bbox_ious`` of inf boxes
gives nan IoU targets, and the printed losses turn nan.

Fix (the thread's answer, confirmed by a second user: "make the learning rate down to 0.0001
can make it work" / "This solution is work well"): ``learning_rate=0.0001`` in the cfg.

Written like pytorch-yolo2: the cfg text is parsed by ``parse_cfg`` into blocks, ``Darknet``
builds conv/bn/leaky + maxpool layers and a ``RegionLoss`` from them, ``build_targets`` /
``bbox_ious`` follow ``region_loss.py`` (``seen < 12800`` warm-up targets, ``sil_thresh``,
``object_scale`` / ``noobject_scale``), ``train.py`` keeps ``learning_rate``, ``momentum``,
``decay``, ``steps``, ``scales`` from ``net_options`` and calls ``adjust_learning_rate`` every
batch, and the loss prints ``seen: nGT .., recall .., proposals .., loss: x .., y .., w .., h ..,
conf .., cls .., total ..``.  Synthetic VOC-like data (random images with 1-3 filled boxes of 3
classes, targets as ``[cls, x, y, w, h]`` rows normalised to the image); a tiny-yolo-voc-like
network (last 3x3 conv 1024 wide, as in tiny-yolo-voc) on 224x224 inputs, 7x7 cells, so that it
runs on a CPU.
"""
import math
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

# ------------------------------------------------------------------ cfg/tiny-yolo-voc.cfg
CFG = """
[net]
batch=8
subdivisions=1
width=224
height=224
channels=3
momentum=0.9
decay=0.0005
angle=0
saturation = 1.5
exposure = 1.5
hue=.1

learning_rate=0.001
burn_in=1000
max_batches = 40100
policy=steps
steps=20000,30000
scales=.1,.1

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=32
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=64
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=128
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=256
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=512
size=3
stride=1
pad=1
activation=leaky

[convolutional]
batch_normalize=1
filters=1024
size=3
stride=1
pad=1
activation=leaky

[convolutional]
size=1
stride=1
pad=1
filters=40
activation=linear

[region]
anchors = 1.08,1.19,  3.42,4.41,  6.63,11.38,  9.42,5.11,  16.62,10.52
bias_match=1
classes=3
coords=4
num=5
softmax=1
jitter=.2
rescore=1

object_scale=5
noobject_scale=1
class_scale=1
coord_scale=1

absolute=1
thresh = .6
random=0
"""
NUM_IMAGES = 64
MAX_EPOCHS = 2
SEED = 0


# ------------------------------------------------------------------ cfg.py
def parse_cfg(cfg_text):
    blocks = []
    block = None
    for line in cfg_text.splitlines():
        line = line.strip()
        if line == '' or line[0] == '#':
            continue
        if line[0] == '[':
            if block:
                blocks.append(block)
            block = dict()
            block['type'] = line.lstrip('[').rstrip(']')
            if block['type'] == 'convolutional':
                block['batch_normalize'] = 0
        else:
            key, value = line.split('=')
            block[key.strip()] = value.strip()
    if block:
        blocks.append(block)
    return blocks


# ------------------------------------------------------------------ utils.py
def bbox_iou(box1, box2):
    mx = min(box1[0] - box1[2] / 2.0, box2[0] - box2[2] / 2.0)
    Mx = max(box1[0] + box1[2] / 2.0, box2[0] + box2[2] / 2.0)
    my = min(box1[1] - box1[3] / 2.0, box2[1] - box2[3] / 2.0)
    My = max(box1[1] + box1[3] / 2.0, box2[1] + box2[3] / 2.0)
    w1, h1, w2, h2 = box1[2], box1[3], box2[2], box2[3]
    uw, uh = Mx - mx, My - my
    cw, ch = w1 + w2 - uw, h1 + h2 - uh
    if cw <= 0 or ch <= 0:
        return 0.0
    carea = cw * ch
    return carea / (w1 * h1 + w2 * h2 - carea)


def bbox_ious(boxes1, boxes2):
    mx = torch.min(boxes1[0] - boxes1[2] / 2.0, boxes2[0] - boxes2[2] / 2.0)
    Mx = torch.max(boxes1[0] + boxes1[2] / 2.0, boxes2[0] + boxes2[2] / 2.0)
    my = torch.min(boxes1[1] - boxes1[3] / 2.0, boxes2[1] - boxes2[3] / 2.0)
    My = torch.max(boxes1[1] + boxes1[3] / 2.0, boxes2[1] + boxes2[3] / 2.0)
    w1, h1, w2, h2 = boxes1[2], boxes1[3], boxes2[2], boxes2[3]
    uw, uh = Mx - mx, My - my
    cw, ch = w1 + w2 - uw, h1 + h2 - uh
    mask = ((cw <= 0) + (ch <= 0) > 0)
    carea = cw * ch
    carea[mask] = 0
    return carea / (w1 * h1 + w2 * h2 - carea)


# ------------------------------------------------------------------ region_loss.py
def build_targets(pred_boxes, target, anchors, num_anchors, num_classes, nH, nW, noobject_scale,
                  object_scale, sil_thresh, seen):
    nB = target.size(0)
    nA = num_anchors
    anchor_step = len(anchors) // num_anchors
    conf_mask = torch.ones(nB, nA, nH, nW) * noobject_scale
    coord_mask = torch.zeros(nB, nA, nH, nW)
    cls_mask = torch.zeros(nB, nA, nH, nW)
    tx = torch.zeros(nB, nA, nH, nW)
    ty = torch.zeros(nB, nA, nH, nW)
    tw = torch.zeros(nB, nA, nH, nW)
    th = torch.zeros(nB, nA, nH, nW)
    tconf = torch.zeros(nB, nA, nH, nW)
    tcls = torch.zeros(nB, nA, nH, nW)

    nAnchors = nA * nH * nW
    nPixels = nH * nW
    for b in range(nB):
        cur_pred_boxes = pred_boxes[b * nAnchors:(b + 1) * nAnchors].t()
        cur_ious = torch.zeros(nAnchors)
        for t in range(50):
            if target[b][t * 5 + 1] == 0:
                break
            gx = target[b][t * 5 + 1] * nW
            gy = target[b][t * 5 + 2] * nH
            gw = target[b][t * 5 + 3] * nW
            gh = target[b][t * 5 + 4] * nH
            cur_gt_boxes = torch.FloatTensor([gx, gy, gw, gh]).repeat(nAnchors, 1).t()
            cur_ious = torch.max(cur_ious, bbox_ious(cur_pred_boxes, cur_gt_boxes))
        conf_mask[b][(cur_ious > sil_thresh).view(nA, nH, nW)] = 0
    if seen < 12800:
        tx.fill_(0.5)
        ty.fill_(0.5)
        tw.zero_()
        th.zero_()
        coord_mask.fill_(1)

    nGT = 0
    nCorrect = 0
    for b in range(nB):
        for t in range(50):
            if target[b][t * 5 + 1] == 0:
                break
            nGT = nGT + 1
            best_iou = 0.0
            best_n = -1
            gx = float(target[b][t * 5 + 1]) * nW
            gy = float(target[b][t * 5 + 2]) * nH
            gi = int(gx)
            gj = int(gy)
            gw = float(target[b][t * 5 + 3]) * nW
            gh = float(target[b][t * 5 + 4]) * nH
            gt_box = [0, 0, gw, gh]
            for n in range(nA):
                aw = anchors[anchor_step * n]
                ah = anchors[anchor_step * n + 1]
                iou = bbox_iou([0, 0, aw, ah], gt_box)
                if iou > best_iou:
                    best_iou = iou
                    best_n = n
            gt_box = [gx, gy, gw, gh]
            pred_box = pred_boxes[b * nAnchors + best_n * nPixels + gj * nW + gi].tolist()

            coord_mask[b][best_n][gj][gi] = 1
            cls_mask[b][best_n][gj][gi] = 1
            conf_mask[b][best_n][gj][gi] = object_scale
            tx[b][best_n][gj][gi] = gx - gi
            ty[b][best_n][gj][gi] = gy - gj
            tw[b][best_n][gj][gi] = math.log(gw / anchors[anchor_step * best_n])
            th[b][best_n][gj][gi] = math.log(gh / anchors[anchor_step * best_n + 1])
            iou = bbox_iou(gt_box, pred_box)  # best_iou
            tconf[b][best_n][gj][gi] = iou
            tcls[b][best_n][gj][gi] = target[b][t * 5]
            if iou > 0.5:
                nCorrect = nCorrect + 1
    return nGT, nCorrect, coord_mask, conf_mask, cls_mask, tx, ty, tw, th, tconf, tcls


class RegionLoss(nn.Module):
    def __init__(self, num_classes=0, anchors=[], num_anchors=1):
        super(RegionLoss, self).__init__()
        self.num_classes = num_classes
        self.anchors = anchors
        self.num_anchors = num_anchors
        self.anchor_step = len(anchors) // num_anchors
        self.coord_scale = 1
        self.noobject_scale = 1
        self.object_scale = 5
        self.class_scale = 1
        self.thresh = 0.6
        self.seen = 0

    def forward(self, output, target):
        nB = output.size(0)
        nA = self.num_anchors
        nC = self.num_classes
        nH = output.size(2)
        nW = output.size(3)

        output = output.view(nB, nA, (5 + nC), nH, nW)
        x = torch.sigmoid(output[:, :, 0])
        y = torch.sigmoid(output[:, :, 1])
        w = output[:, :, 2]
        h = output[:, :, 3]
        conf = torch.sigmoid(output[:, :, 4])
        cls = output[:, :, 5:5 + nC].reshape(nB * nA, nC, nH * nW).transpose(1, 2).reshape(-1, nC)

        with torch.no_grad():
            grid_x = torch.linspace(0, nW - 1, nW).repeat(nH, 1).repeat(nB * nA, 1, 1).view(-1)
            grid_y = torch.linspace(0, nH - 1, nH).repeat(nW, 1).t().repeat(nB * nA, 1, 1).view(-1)
            anchor_w = torch.Tensor(self.anchors).view(nA, self.anchor_step)[:, 0:1]
            anchor_h = torch.Tensor(self.anchors).view(nA, self.anchor_step)[:, 1:2]
            anchor_w = anchor_w.repeat(nB, 1).repeat(1, 1, nH * nW).view(-1)
            anchor_h = anchor_h.repeat(nB, 1).repeat(1, 1, nH * nW).view(-1)
            pred_boxes = torch.zeros(4, nB * nA * nH * nW)
            pred_boxes[0] = x.reshape(-1) + grid_x
            pred_boxes[1] = y.reshape(-1) + grid_y
            pred_boxes[2] = torch.exp(w.reshape(-1)) * anchor_w
            pred_boxes[3] = torch.exp(h.reshape(-1)) * anchor_h
            pred_boxes = pred_boxes.transpose(0, 1).contiguous().view(-1, 4)

        nGT, nCorrect, coord_mask, conf_mask, cls_mask, tx, ty, tw, th, tconf, tcls = \
            build_targets(pred_boxes, target, self.anchors, nA, nC, nH, nW, self.noobject_scale,
                          self.object_scale, self.thresh, self.seen)
        cls_mask = (cls_mask == 1)
        nProposals = int((conf > 0.25).sum().item())
        tcls = tcls[cls_mask].long()
        conf_mask = conf_mask.sqrt()
        cls = cls[cls_mask.view(-1, 1).repeat(1, nC)].view(-1, nC)

        mse = nn.MSELoss(reduction='sum')
        loss_x = self.coord_scale * mse(x * coord_mask, tx * coord_mask) / 2.0
        loss_y = self.coord_scale * mse(y * coord_mask, ty * coord_mask) / 2.0
        loss_w = self.coord_scale * mse(w * coord_mask, tw * coord_mask) / 2.0
        loss_h = self.coord_scale * mse(h * coord_mask, th * coord_mask) / 2.0
        loss_conf = mse(conf * conf_mask, tconf * conf_mask) / 2.0
        loss_cls = self.class_scale * nn.CrossEntropyLoss(reduction='sum')(cls, tcls)
        loss = loss_x + loss_y + loss_w + loss_h + loss_conf + loss_cls
        print('%d: nGT %d, recall %d, proposals %d, loss: x %f, y %f, w %f, h %f, conf %f, cls %f, '
              'total %f' % (self.seen, nGT, nCorrect, nProposals, loss_x.item(), loss_y.item(),
                            loss_w.item(), loss_h.item(), loss_conf.item(), loss_cls.item(),
                            loss.item()), flush=True)
        return loss


# ------------------------------------------------------------------ darknet.py
class MaxPoolStride1(nn.Module):
    def forward(self, x):
        return F.max_pool2d(F.pad(x, (0, 1, 0, 1), mode='replicate'), 2, stride=1)


class Darknet(nn.Module):
    def __init__(self, cfg_text):
        super(Darknet, self).__init__()
        self.blocks = parse_cfg(cfg_text)
        self.models = self.create_network(self.blocks)
        self.loss = self.models[len(self.models) - 1]
        self.width = int(self.blocks[0]['width'])
        self.height = int(self.blocks[0]['height'])
        self.seen = 0

    def forward(self, x):
        for block, model in zip(self.blocks[1:], self.models):
            if block['type'] in ('convolutional', 'maxpool'):
                x = model(x)
        return x

    def create_network(self, blocks):
        models = nn.ModuleList()
        prev_filters = 3
        conv_id = 0
        for block in blocks:
            if block['type'] == 'net':
                prev_filters = int(block['channels'])
                continue
            elif block['type'] == 'convolutional':
                conv_id = conv_id + 1
                batch_normalize = int(block['batch_normalize'])
                filters = int(block['filters'])
                kernel_size = int(block['size'])
                stride = int(block['stride'])
                is_pad = int(block['pad'])
                pad = (kernel_size - 1) // 2 if is_pad else 0
                activation = block['activation']
                model = nn.Sequential()
                if batch_normalize:
                    model.add_module('conv{0}'.format(conv_id),
                                     nn.Conv2d(prev_filters, filters, kernel_size, stride, pad, bias=False))
                    model.add_module('bn{0}'.format(conv_id), nn.BatchNorm2d(filters))
                else:
                    model.add_module('conv{0}'.format(conv_id),
                                     nn.Conv2d(prev_filters, filters, kernel_size, stride, pad))
                if activation == 'leaky':
                    model.add_module('leaky{0}'.format(conv_id), nn.LeakyReLU(0.1, inplace=True))
                prev_filters = filters
                models.append(model)
            elif block['type'] == 'maxpool':
                pool_size = int(block['size'])
                stride = int(block['stride'])
                models.append(nn.MaxPool2d(pool_size, stride) if stride > 1 else MaxPoolStride1())
            elif block['type'] == 'region':
                anchors = [float(i) for i in block['anchors'].split(',')]
                loss = RegionLoss(int(block['classes']), anchors, int(block['num']))
                loss.object_scale = float(block['object_scale'])
                loss.noobject_scale = float(block['noobject_scale'])
                loss.class_scale = float(block['class_scale'])
                loss.coord_scale = float(block['coord_scale'])
                loss.thresh = float(block['thresh'])
                models.append(loss)
        return models


# ------------------------------------------------------------------ dataset.py
class listDataset(torch.utils.data.Dataset):
    def __init__(self, num, shape, num_classes, seed):
        rng = np.random.RandomState(seed)
        self.samples = []
        for _ in range(num):
            img = rng.rand(3, shape[1], shape[0]).astype(np.float32)
            label = np.zeros(50 * 5, dtype=np.float32)
            for t in range(rng.randint(1, 4)):
                bw, bh = rng.randint(16, shape[0] // 2), rng.randint(16, shape[1] // 2)
                x0, y0 = rng.randint(0, shape[0] - bw), rng.randint(0, shape[1] - bh)
                c = rng.randint(num_classes)
                img[:, y0:y0 + bh, x0:x0 + bw] = 0.2 + 0.3 * c
                label[t * 5:(t + 1) * 5] = [c, (x0 + bw / 2) / shape[0], (y0 + bh / 2) / shape[1],
                                            bw / shape[0], bh / shape[1]]
            self.samples.append((torch.from_numpy(img), torch.from_numpy(label)))

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


# ------------------------------------------------------------------ train.py
random.seed(SEED)
np.random.seed(SEED)
torch.manual_seed(SEED)
torch.set_num_threads(2)

net_options = parse_cfg(CFG)[0]
batch_size = int(net_options['batch'])
max_batches = int(net_options['max_batches'])
learning_rate = float(net_options['learning_rate'])
momentum = float(net_options['momentum'])
decay = float(net_options['decay'])
steps = [float(step) for step in net_options['steps'].split(',')]
scales = [float(scale) for scale in net_options['scales'].split(',')]

model = Darknet(CFG)
region_loss = model.loss
region_loss.seen = model.seen
processed_batches = model.seen // batch_size
init_width = model.width
init_height = model.height

g = torch.Generator()
g.manual_seed(SEED)
train_loader = torch.utils.data.DataLoader(
    listDataset(NUM_IMAGES, (init_width, init_height), region_loss.num_classes, SEED),
    batch_size=batch_size, shuffle=True, generator=g)

optimizer = optim.SGD(model.parameters(), lr=learning_rate / batch_size, momentum=momentum,
                      dampening=0, weight_decay=decay * batch_size)


def adjust_learning_rate(optimizer, batch):
    """Sets the learning rate to the initial LR decayed by 10 every 30 epochs"""
    lr = learning_rate
    for i in range(len(steps)):
        scale = scales[i] if i < len(scales) else 1
        if batch >= steps[i]:
            lr = lr * scale
            if batch == steps[i]:
                break
        else:
            break
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr / batch_size
    return lr


def train(epoch):
    global processed_batches
    lr = adjust_learning_rate(optimizer, processed_batches)
    print('epoch %d, processed %d samples, lr %f' % (epoch, epoch * len(train_loader.dataset), lr))
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        adjust_learning_rate(optimizer, processed_batches)
        processed_batches = processed_batches + 1
        optimizer.zero_grad()
        output = model(data)
        region_loss.seen = region_loss.seen + data.size(0)
        loss = region_loss(output, target)
        loss.backward()
        optimizer.step()


if __name__ == '__main__':
    for epoch in range(MAX_EPOCHS):
        train(epoch)
