"""QDTrack-style quasi-dense tracker on MOT17-like frames, trained without grad_clip.

Report: https://github.com/SysCV/qdtrack/issues/81 ("MOT17 Exploding Training
Gradients"). Training QDTrack (Faster R-CNN + quasi-dense embedding head) on MOT17,
the classification losses become very large and eventually NaN. The maintainer
answered that the MOT17 recipe relies on gradient clipping,
``optimizer_config = dict(grad_clip=dict(max_norm=35, norm_type=2))`` next to
``SGD(lr=0.02, momentum=0.9, weight_decay=1e-4)``, to stabilise training.

The script is that recipe in miniature, trained from scratch as the reporter turned
out to be doing (no detector checkpoint loaded): caffe-style image normalisation
(mean subtraction, std=1, so pixels lie in about [-124, 152]), a residual backbone
whose norm layers are frozen (``requires_grad=False``) with mmcv's kaiming init, the
RoI bbox head (shared fcs -> person/background scores and box deltas) and the
quasi-dense embedding head trained with the multi-positive cross-entropy and the
auxiliary L2 loss on key/reference frame pairs. The optimizer config was copied
without its ``grad_clip`` entry, so SGD applies the raw gradient: its norm is ~220
at iter 1 and ~2400 at iter 2, loss_cls jumps 2.2 -> 193 -> 5.5e8 and at iter 4
every loss is nan.

Fix (maintainers): clip the gradient norm to 35 before every optimizer step,
i.e. ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=35,
norm_type=2)`` right after ``loss.backward()``.
"""
import argparse
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

cfg = dict(
    img_norm_cfg=dict(mean=[103.530, 116.280, 123.675], std=[1.0, 1.0, 1.0]),
    img_size=48,
    num_objects=3,
    num_bg_rois=6,
    embed_channels=32,
    optimizer=dict(type='SGD', lr=0.02, momentum=0.9, weight_decay=0.0001),
    loss_track_weight=0.25,
    loss_track_aux_weight=1.0,
    total_iters=30,
    samples_per_gpu=2,
    log_interval=1,
)


class FrozenBN(nn.Module):
    """BatchNorm with frozen statistics (norm_cfg=dict(requires_grad=False))."""

    def __init__(self, c):
        super().__init__()
        for name, value in (('weight', 1.0), ('bias', 0.0), ('running_mean', 0.0), ('running_var', 1.0)):
            self.register_buffer(name, torch.full((c,), value))

    def forward(self, x):
        scale = self.weight * (self.running_var + 1e-5).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = FrozenBN(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = FrozenBN(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), FrozenBN(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


def resnet_mini():
    stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), FrozenBN(16), nn.ReLU(inplace=True))
    return nn.Sequential(stem, BasicBlock(16, 16), BasicBlock(16, 32, 2), BasicBlock(32, 32),
                         BasicBlock(32, 32, 2), BasicBlock(32, 32))


def roi_pool(feat, rois, out=2, stride=8):
    pooled = []
    for b, (x1, y1, x2, y2) in rois:
        x1, y1 = int(x1 // stride), int(y1 // stride)
        x2, y2 = max(math.ceil(x2 / stride), x1 + 1), max(math.ceil(y2 / stride), y1 + 1)
        pooled.append(F.adaptive_avg_pool2d(feat[b:b + 1, :, y1:y2, x1:x2], out))
    return torch.cat(pooled)


class QuasiDenseFasterRCNN(nn.Module):
    def __init__(self, embed_channels):
        super().__init__()
        self.backbone = resnet_mini()
        # Shared2FCBBoxHead
        self.shared_fcs = nn.Sequential(nn.Linear(32 * 4, 128), nn.ReLU(inplace=True),
                                        nn.Linear(128, 128), nn.ReLU(inplace=True))
        self.fc_cls = nn.Linear(128, 2)
        self.fc_reg = nn.Linear(128, 4)
        # QuasiDenseEmbedHead
        convs = []
        for _ in range(2):
            convs += [nn.Conv2d(32, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.ReLU(inplace=True)]
        self.embed_convs = nn.Sequential(*convs)
        self.embed_fc = nn.Linear(32 * 4, 128)
        self.fc_embed = nn.Linear(128, embed_channels)
        self.init_weights()

    def init_weights(self):
        for m in self.backbone.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
        nn.init.normal_(self.fc_cls.weight, 0, 0.01)
        nn.init.normal_(self.fc_reg.weight, 0, 0.001)
        nn.init.normal_(self.fc_embed.weight, 0, 0.01)
        for m in (self.fc_cls, self.fc_reg, self.fc_embed):
            nn.init.zeros_(m.bias)

    def bbox_forward(self, feat, rois):
        x = self.shared_fcs(roi_pool(feat, rois).flatten(1))
        return self.fc_cls(x), self.fc_reg(x)

    def embed_forward(self, feat, rois):
        x = self.embed_convs(roi_pool(feat, rois))
        return self.fc_embed(F.relu(self.embed_fc(x.flatten(1))))


def multi_pos_cross_entropy(pred, label):
    pos_inds, neg_inds = label == 1, label == 0
    pred_pos = pred * pos_inds.float()
    pred_neg = pred * neg_inds.float()
    pred_pos[neg_inds] = pred_pos[neg_inds] + float('inf')
    pred_neg[pos_inds] = pred_neg[pos_inds] + float('-inf')
    _pos_expand = torch.repeat_interleave(pred_pos, pred.shape[1], dim=1)
    _neg_expand = pred_neg.repeat(1, pred.shape[1])
    x = F.pad(_neg_expand - _pos_expand, (0, 1), 'constant', 0)
    return torch.logsumexp(x, dim=1).mean()


def l2_aux_loss(cos_sim, label, neg_margin=0.1):
    diff = torch.where(label == 1, cos_sim - 1.0, F.relu(cos_sim - neg_margin))
    return (diff ** 2).mean()


class MOT17PairSampler:
    """Synthetic MOT17-like key/reference frame pairs (pedestrians as coloured boxes)."""

    def __init__(self, size, num_objects, seed):
        self.g = np.random.RandomState(seed)
        self.size, self.n = size, num_objects
        self.colors = self.g.uniform(0, 255, size=(num_objects, 3))
        self.tint = self.g.uniform(0.2, 1.0, size=3)

    def frame(self, boxes):
        yy, xx = np.meshgrid(np.linspace(0, 1, self.size), np.linspace(0, 1, self.size), indexing='ij')
        img = 255 * (0.5 * yy + 0.5 * xx)[None] * self.tint[:, None, None]
        img = np.clip(img + self.g.normal(0, 20, size=(3, self.size, self.size)), 0, 255)
        for k, (x1, y1, x2, y2) in enumerate(boxes):
            img[:, int(y1):int(y2), int(x1):int(x2)] = self.colors[k][:, None, None]
        return img

    def sample(self):
        key = []
        for _ in range(self.n):
            w, h = self.g.randint(8, 14), self.g.randint(14, 24)
            x1, y1 = self.g.randint(0, self.size - w), self.g.randint(0, self.size - h)
            key.append([x1, y1, x1 + w, y1 + h])
        key, shift = np.array(key, dtype=np.float64), self.g.randint(-3, 4, size=(self.n, 2))
        ref = key.copy()
        ref[:, [0, 2]] = np.clip(ref[:, [0, 2]] + shift[:, :1], 0, self.size)
        ref[:, [1, 3]] = np.clip(ref[:, [1, 3]] + shift[:, 1:], 0, self.size)
        bg = self.g.randint(0, self.size - 8, size=(cfg['num_bg_rois'], 2)).astype(np.float64)
        return self.frame(key), key, self.frame(ref), ref, np.concatenate([bg, bg + 8], axis=1)


def normalize(img, norm_cfg):
    mean = torch.tensor(norm_cfg['mean']).view(1, 3, 1, 1)
    std = torch.tensor(norm_cfg['std']).view(1, 3, 1, 1)
    return (img - mean) / std


def forward_train(model, imgs, boxes, ref_imgs, ref_boxes, bg_boxes):
    x, ref_x = model.backbone(imgs), model.backbone(ref_imgs)
    rois, labels, reg_t = [], [], []
    for b in range(len(boxes)):
        for box in boxes[b]:
            rois.append((b, box)); labels.append(0); reg_t.append([0.0, 0.0, 0.0, 0.0])
        for box in bg_boxes[b]:
            rois.append((b, box)); labels.append(1); reg_t.append([0.0, 0.0, 0.0, 0.0])
    cls_score, bbox_pred = model.bbox_forward(x, rois)
    labels = torch.tensor(labels)
    loss_cls = F.cross_entropy(cls_score, labels)
    fg = labels == 0
    loss_bbox = F.l1_loss(bbox_pred[fg], torch.tensor(reg_t)[fg])
    n = len(boxes[0])
    key_embeds = model.embed_forward(x, [(b, box) for b, bs in enumerate(boxes) for box in bs])
    ref_embeds = model.embed_forward(ref_x, [(b, box) for b, bs in enumerate(ref_boxes) for box in bs])
    loss_track, loss_aux = 0.0, 0.0
    for b in range(len(boxes)):
        k, r = key_embeds[b * n:(b + 1) * n], ref_embeds[b * n:(b + 1) * n]
        label = torch.eye(n)
        loss_track = loss_track + multi_pos_cross_entropy(torch.mm(k, r.t()), label)
        cos = torch.mm(F.normalize(k, dim=1), F.normalize(r, dim=1).t())
        loss_aux = loss_aux + l2_aux_loss(cos, label)
    return dict(loss_cls=loss_cls, loss_bbox=loss_bbox,
                loss_track=cfg['loss_track_weight'] * loss_track / len(boxes),
                loss_track_aux=cfg['loss_track_aux_weight'] * loss_aux / len(boxes))


def main():
    parser = argparse.ArgumentParser(description='Train QDTrack on MOT17 (mini)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--iters', type=int, default=cfg['total_iters'])
    args = parser.parse_args()
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    model = QuasiDenseFasterRCNN(cfg['embed_channels'])
    opt_cfg = {k: v for k, v in cfg['optimizer'].items() if k != 'type'}
    optimizer = torch.optim.SGD(model.parameters(), **opt_cfg)
    sampler = MOT17PairSampler(cfg['img_size'], cfg['num_objects'], args.seed)

    model.train()
    for it in range(1, args.iters + 1):
        batch = [sampler.sample() for _ in range(cfg['samples_per_gpu'])]
        imgs = normalize(torch.tensor(np.stack([s[0] for s in batch]), dtype=torch.float32), cfg['img_norm_cfg'])
        ref_imgs = normalize(torch.tensor(np.stack([s[2] for s in batch]), dtype=torch.float32), cfg['img_norm_cfg'])
        boxes, ref_boxes, bg_boxes = [s[1] for s in batch], [s[3] for s in batch], [s[4] for s in batch]

        losses = forward_train(model, imgs, boxes, ref_imgs, ref_boxes, bg_boxes)
        loss = sum(losses.values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        if it % cfg['log_interval'] == 0:  # TextLoggerHook
            msg = ', '.join(f'{k}: {v.item():.4f}' for k, v in losses.items())
            print(f"Iter [{it}/{args.iters}]\tlr: {optimizer.param_groups[0]['lr']:.3e}, {msg}, loss: {loss.item():.4f}")
        if not torch.isfinite(loss):
            print(f'loss became {loss.item()} at iter {it}, stopping')
            break


if __name__ == '__main__':
    main()
