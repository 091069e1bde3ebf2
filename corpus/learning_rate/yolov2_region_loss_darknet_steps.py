"""Tiny YOLOv2 trained with a darknet-style cfg and region loss (pytorch-yolo2 layout).

The network, the learning-rate policy ("steps"/"scales" applied per processed batch, lr divided
by the batch size and decay multiplied by it, as darknet does) and the region loss follow
marvis/pytorch-yolo2.  Images are synthetic: coloured rectangles of three classes on noise.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CFG = """
[net]
batch=16
width=64
height=64
learning_rate=0.15
momentum=0.9
decay=0.0005
policy=steps
steps=-1,100,2000,3000
scales=.1,10,.1,.1
max_epochs=10

[region]
anchors=0.8,0.8,2.0,2.0
classes=3
num=2
object_scale=5
noobject_scale=1
class_scale=1
coord_scale=1
"""


def parse_cfg(text):
    blocks, block = [], None
    for line in text.strip().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            block = {"type": line[1:-1]}
            blocks.append(block)
        else:
            key, value = line.split("=")
            block[key.strip()] = value.strip()
    return blocks


def conv_bn_leaky(cin, cout, k=3):
    return [nn.Conv2d(cin, cout, k, 1, k // 2, bias=False), nn.BatchNorm2d(cout), nn.LeakyReLU(0.1, inplace=True)]


class TinyYoloV2(nn.Module):
    def __init__(self, num_anchors, num_classes):
        super().__init__()
        self.features = nn.Sequential(
            *conv_bn_leaky(3, 16), nn.MaxPool2d(2),
            *conv_bn_leaky(16, 32), nn.MaxPool2d(2),
            *conv_bn_leaky(32, 64), nn.MaxPool2d(2),
            *conv_bn_leaky(64, 128), nn.MaxPool2d(2),
            *conv_bn_leaky(128, 128),
            nn.Conv2d(128, num_anchors * (5 + num_classes), 1))

    def forward(self, x):
        return self.features(x)


def bbox_iou(box1, box2):
    """Boxes as (cx, cy, w, h); broadcasts over leading dims."""
    mx = torch.min(box1[..., 0] - box1[..., 2] / 2, box2[..., 0] - box2[..., 2] / 2)
    Mx = torch.max(box1[..., 0] + box1[..., 2] / 2, box2[..., 0] + box2[..., 2] / 2)
    my = torch.min(box1[..., 1] - box1[..., 3] / 2, box2[..., 1] - box2[..., 3] / 2)
    My = torch.max(box1[..., 1] + box1[..., 3] / 2, box2[..., 1] + box2[..., 3] / 2)
    cw = box1[..., 2] + box2[..., 2] - (Mx - mx)
    ch = box1[..., 3] + box2[..., 3] - (My - my)
    carea = cw.clamp(min=0) * ch.clamp(min=0)
    uarea = box1[..., 2] * box1[..., 3] + box2[..., 2] * box2[..., 3] - carea
    return carea / uarea


class RegionLoss(nn.Module):
    def __init__(self, num_classes, anchors, num_anchors, object_scale, noobject_scale, class_scale, coord_scale):
        super().__init__()
        self.num_classes, self.num_anchors = num_classes, num_anchors
        self.anchors = torch.tensor(anchors).view(num_anchors, 2)
        self.object_scale, self.noobject_scale = object_scale, noobject_scale
        self.class_scale, self.coord_scale = class_scale, coord_scale
        self.seen = 0

    def forward(self, output, targets):
        nB, nA, nC = output.size(0), self.num_anchors, self.num_classes
        nH, nW = output.size(2), output.size(3)
        output = output.view(nB, nA, 5 + nC, nH, nW)
        x = torch.sigmoid(output[:, :, 0])
        y = torch.sigmoid(output[:, :, 1])
        w = output[:, :, 2]
        h = output[:, :, 3]
        conf = torch.sigmoid(output[:, :, 4])
        cls = output[:, :, 5:].permute(0, 1, 3, 4, 2)

        grid_y, grid_x = torch.meshgrid(torch.arange(nH).float(), torch.arange(nW).float(), indexing="ij")
        aw = self.anchors[:, 0].view(1, nA, 1, 1)
        ah = self.anchors[:, 1].view(1, nA, 1, 1)
        pred_boxes = torch.stack([x.detach() + grid_x, y.detach() + grid_y,
                                  torch.exp(w.detach()) * aw, torch.exp(h.detach()) * ah], -1)

        coord_mask = torch.zeros(nB, nA, nH, nW)
        conf_mask = torch.ones(nB, nA, nH, nW) * self.noobject_scale
        tx, ty = torch.zeros(nB, nA, nH, nW), torch.zeros(nB, nA, nH, nW)
        tw, th = torch.zeros(nB, nA, nH, nW), torch.zeros(nB, nA, nH, nW)
        tconf = torch.zeros(nB, nA, nH, nW)
        tcls = torch.zeros(nB, nA, nH, nW, dtype=torch.long)
        nGT = nCorrect = 0
        for b in range(nB):
            for cls_id, cx, cy, bw, bh in targets[b].tolist():
                nGT += 1
                gx, gy, gw, gh = cx * nW, cy * nH, bw * nW, bh * nH
                gi, gj = int(gx), int(gy)
                anchor_boxes = torch.cat([torch.zeros(nA, 2), self.anchors], 1)
                best_n = int(bbox_iou(anchor_boxes, torch.tensor([0, 0, gw, gh])).argmax())
                gt_box = torch.tensor([gx, gy, gw, gh])
                iou = float(bbox_iou(gt_box, pred_boxes[b, best_n, gj, gi]))
                coord_mask[b, best_n, gj, gi] = 1
                conf_mask[b, best_n, gj, gi] = self.object_scale
                tx[b, best_n, gj, gi] = gx - gi
                ty[b, best_n, gj, gi] = gy - gj
                tw[b, best_n, gj, gi] = math.log(gw / self.anchors[best_n, 0])
                th[b, best_n, gj, gi] = math.log(gh / self.anchors[best_n, 1])
                tconf[b, best_n, gj, gi] = iou
                tcls[b, best_n, gj, gi] = int(cls_id)
                if iou > 0.5:
                    nCorrect += 1
        nProposals = int((conf > 0.25).sum())
        cls_mask = coord_mask.bool()

        loss_x = self.coord_scale * ((x - tx) ** 2 * coord_mask).sum() / 2.0
        loss_y = self.coord_scale * ((y - ty) ** 2 * coord_mask).sum() / 2.0
        loss_w = self.coord_scale * ((w - tw) ** 2 * coord_mask).sum() / 2.0
        loss_h = self.coord_scale * ((h - th) ** 2 * coord_mask).sum() / 2.0
        loss_conf = ((conf - tconf) ** 2 * conf_mask).sum() / 2.0
        loss_cls = self.class_scale * F.cross_entropy(cls[cls_mask], tcls[cls_mask], reduction="sum")
        loss = loss_x + loss_y + loss_w + loss_h + loss_conf + loss_cls
        print("%d: nGT %d, recall %d, proposals %d, loss: x %f, y %f, w %f, h %f, conf %f, cls %f, total %f"
              % (self.seen, nGT, nCorrect, nProposals, loss_x.item(), loss_y.item(), loss_w.item(),
                 loss_h.item(), loss_conf.item(), loss_cls.item(), loss.item()))
        return loss


def synthetic_voc(n_images, size, num_classes, gen):
    images = torch.rand(n_images, 3, size, size, generator=gen) * 0.3
    labels = []
    for i in range(n_images):
        boxes = []
        for _ in range(int(torch.randint(1, 4, (1,), generator=gen))):
            w, h = torch.randint(8, 40, (2,), generator=gen).tolist()
            x0, y0 = torch.randint(0, size - 40, (2,), generator=gen).tolist()
            c = int(torch.randint(0, num_classes, (1,), generator=gen))
            images[i, c, y0:y0 + h, x0:x0 + w] += 0.7
            boxes.append([c, (x0 + w / 2) / size, (y0 + h / 2) / size, w / size, h / size])
        labels.append(torch.tensor(boxes))
    return images, labels


def adjust_learning_rate(optimizer, batch, learning_rate, steps, scales, batch_size):
    lr = learning_rate
    for step, scale in zip(steps, scales):
        if batch >= step:
            lr = lr * scale
        else:
            break
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr / batch_size
    return lr


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    blocks = parse_cfg(CFG)
    net_options, region = blocks[0], blocks[1]
    batch_size = int(net_options["batch"])
    learning_rate = float(net_options["learning_rate"])
    momentum = float(net_options["momentum"])
    decay = float(net_options["decay"])
    steps = [float(s) for s in net_options["steps"].split(",")]
    scales = [float(s) for s in net_options["scales"].split(",")]
    max_epochs = int(net_options["max_epochs"])
    num_classes, num_anchors = int(region["classes"]), int(region["num"])

    model = TinyYoloV2(num_anchors, num_classes)
    region_loss = RegionLoss(num_classes, [float(a) for a in region["anchors"].split(",")], num_anchors,
                             float(region["object_scale"]), float(region["noobject_scale"]),
                             float(region["class_scale"]), float(region["coord_scale"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate / batch_size, momentum=momentum,
                                dampening=0, weight_decay=decay * batch_size)

    gen = torch.Generator().manual_seed(0)
    images, labels = synthetic_voc(256, int(net_options["width"]), num_classes, gen)
    processed_batches = 0
    for epoch in range(max_epochs):
        perm = torch.randperm(len(images), generator=gen)
        lr = adjust_learning_rate(optimizer, processed_batches, learning_rate, steps, scales, batch_size)
        print("epoch %d, processed %d samples, lr %f" % (epoch, epoch * len(images), lr))
        model.train()
        for start in range(0, len(images), batch_size):
            idx = perm[start:start + batch_size]
            adjust_learning_rate(optimizer, processed_batches, learning_rate, steps, scales, batch_size)
            processed_batches += 1
            data, target = images[idx], [labels[int(i)] for i in idx]
            region_loss.seen += len(idx)
            output = model(data)
            loss = region_loss(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
