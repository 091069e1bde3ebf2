"""Fast R-CNN style box head trained from a refactored train script with hard-coded settings.

Bug reproduced: https://github.com/roytseng-tw/Detectron.pytorch/issues/29 -- a user rewrote
train.py with hard-coded variables instead of the command-line arguments; right after the first
steps the loss_rcnn_bbox (and then every loss) is NaN.  The maintainer: "too large lr is likely
to be the cause of NaN loss ... use train_net_step.py, which includes learning rate warm up";
another user fixed the same thing by reducing the learning rate, and the reporter confirmed
"Your suggestions worked!".

Images are fed the Detectron way: BGR pixel values minus the pixel means, not divided by a std,
so the un-normalised conv backbone sees inputs of size ~100 and SGD at lr 0.02 with no warm-up
throws the weights out of range within a few iterations.

Fix: a smaller learning rate (0.002 here) trains fine.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

CFG = {
    'LR': 0.02,
    'MOMENTUM': 0.9,
    'WEIGHT_DECAY': 1e-4,
    'IMS_PER_BATCH': 2,
    'ROIS_PER_IM': 32,
    'MAX_ITER': 120,
    'NUM_CLASSES': 4,
    'PIXEL_MEANS': np.array([[[102.98, 115.95, 122.77]]], dtype=np.float32),
    'DISP_INTERVAL': 5,
}

torch.manual_seed(3)
np.random.seed(3)


def make_roidb(n_images=64, size=96):
    """Synthetic images with 1-3 coloured rectangles, as a Detectron-like roidb list."""
    roidb = []
    colours = {1: (200, 40, 40), 2: (40, 200, 40), 3: (40, 40, 200)}
    for _ in range(n_images):
        im = np.random.randint(60, 140, size=(size, size, 3)).astype(np.float32)
        boxes, classes = [], []
        for _ in range(np.random.randint(1, 4)):
            c = np.random.randint(1, 4)
            w, h = np.random.randint(16, 48, size=2)
            x1, y1 = np.random.randint(0, size - w), np.random.randint(0, size - h)
            im[y1:y1 + h, x1:x1 + w] = colours[c]
            boxes.append([x1, y1, x1 + w - 1, y1 + h - 1])
            classes.append(c)
        roidb.append({'image': im, 'boxes': np.array(boxes, np.float32), 'gt_classes': np.array(classes)})
    return roidb


def sample_rois(entry, n):
    """Jitter the ground-truth boxes to get fg proposals, random boxes for bg."""
    gt = entry['boxes']
    rois, labels, targets = [], [], []
    for i in range(n):
        if i < n // 2:
            k = np.random.randint(len(gt))
            g = gt[k]
            w, h = g[2] - g[0] + 1, g[3] - g[1] + 1
            r = g + np.random.uniform(-0.2, 0.2, 4) * np.array([w, h, w, h])
            r = np.clip(r, 0, 95)
            if r[2] - r[0] < 4 or r[3] - r[1] < 4:
                r = g.copy()
            rw, rh = r[2] - r[0] + 1, r[3] - r[1] + 1
            t = [((g[0] + g[2]) - (r[0] + r[2])) / 2 / rw, ((g[1] + g[3]) - (r[1] + r[3])) / 2 / rh,
                 np.log(w / rw), np.log(h / rh)]
            rois.append(r); labels.append(entry['gt_classes'][k]); targets.append(t)
        else:
            x1, y1 = np.random.randint(0, 70, size=2)
            rois.append(np.array([x1, y1, x1 + 24, y1 + 24], np.float32)); labels.append(0); targets.append([0, 0, 0, 0])
    return np.array(rois, np.float32), np.array(labels), np.array(targets, np.float32)


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 64, 3, padding=1)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.relu(self.conv3(x))                      # stride 4


class FastRCNNHead(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.fc6 = nn.Linear(64 * 4 * 4, 256)
        self.fc7 = nn.Linear(256, 256)
        self.cls_score = nn.Linear(256, num_classes)
        self.bbox_pred = nn.Linear(256, 4 * num_classes)
        nn.init.normal_(self.cls_score.weight, std=0.01)
        nn.init.normal_(self.bbox_pred.weight, std=0.001)

    def forward(self, feats, rois, batch_idx, stride=4):
        pooled = []
        for r, b in zip(rois, batch_idx):
            x1, y1, x2, y2 = [int(v) for v in (r / stride)]
            crop = feats[b, :, y1:y2 + 1, x1:x2 + 1]
            pooled.append(F.adaptive_max_pool2d(crop, 4))
        x = torch.stack(pooled).flatten(1)
        x = F.relu(self.fc7(F.relu(self.fc6(x))))
        return self.cls_score(x), self.bbox_pred(x)


class Detector(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.body = Backbone()
        self.box_head = FastRCNNHead(num_classes)

    def forward(self, ims, rois, batch_idx, labels, bbox_targets):
        feats = self.body(ims)
        cls_score, bbox_pred = self.box_head(feats, rois, batch_idx)
        loss_cls = F.cross_entropy(cls_score, labels)
        bbox_pred = bbox_pred.view(-1, CFG['NUM_CLASSES'], 4)[torch.arange(len(labels)), labels]
        fg = (labels > 0).float().unsqueeze(1)
        loss_bbox = F.smooth_l1_loss(bbox_pred * fg, bbox_targets * fg, reduction='sum') / len(labels)
        return {'loss_rcnn_cls': loss_cls, 'loss_rcnn_bbox': loss_bbox}


roidb = make_roidb()
maskRCNN = Detector(CFG['NUM_CLASSES'])
params = [p for p in maskRCNN.parameters() if p.requires_grad]
optimizer = torch.optim.SGD(params, lr=CFG['LR'], momentum=CFG['MOMENTUM'], weight_decay=CFG['WEIGHT_DECAY'])

maskRCNN.train()
perm = np.random.permutation(len(roidb))
cursor = 0
for step in range(CFG['MAX_ITER']):
    ims, rois, bidx, labels, targets = [], [], [], [], []
    for b in range(CFG['IMS_PER_BATCH']):
        if cursor >= len(perm):
            perm, cursor = np.random.permutation(len(roidb)), 0
        entry = roidb[perm[cursor]]; cursor += 1
        ims.append((entry['image'] - CFG['PIXEL_MEANS']).transpose(2, 0, 1))
        r, l, t = sample_rois(entry, CFG['ROIS_PER_IM'])
        rois.append(r); labels.append(l); targets.append(t); bidx += [b] * len(r)
    input_data = dict(ims=torch.from_numpy(np.stack(ims)), rois=np.concatenate(rois), batch_idx=bidx,
                      labels=torch.from_numpy(np.concatenate(labels)).long(),
                      bbox_targets=torch.from_numpy(np.concatenate(targets)))
    outputs = maskRCNN(**input_data)
    loss = outputs['loss_rcnn_cls'] + outputs['loss_rcnn_bbox']
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % CFG['DISP_INTERVAL'] == 0:
        print('[step %d] lr: %.4f loss: %.4f loss_rcnn_cls: %.4f loss_rcnn_bbox: %.4f' % (
            step, optimizer.param_groups[0]['lr'], loss.item(),
            outputs['loss_rcnn_cls'].item(), outputs['loss_rcnn_bbox'].item()))
