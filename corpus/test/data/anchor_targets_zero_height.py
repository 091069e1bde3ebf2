"""Text-detector box regression: a few annotations have zero height.

Reported in eragonruan/text-detection-ctpn#49 ("loss become nan, invalid value encountered in
log", https://github.com/eragonruan/text-detection-ctpn/issues/49): the regression targets are
computed as ``np.log(gt_heights / ex_heights)``.  A handful of annotation lines describe boxes
whose top and bottom y coordinate are equal (bad labels), so the target is log(0) = -inf, the
regression loss is inf and the first backward pass through such a batch fills the weights with
inf/NaN.  The maintainer's answer: "this may be caused by the annotation of your training data";
re-generating / filtering the labels fixed it.

Fix: drop (or repair) annotation boxes with non-positive width/height before building targets.
"""
import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

torch.manual_seed(1)
rng = np.random.default_rng(1)


def fake_annotation_file(n=600):
    lines = []
    for k in range(n):
        x1 = rng.uniform(0, 200)
        y1 = rng.uniform(0, 200)
        h = rng.uniform(8, 40)
        if k in (137, 291, 455):          # degenerate labels from a buggy export
            h = 0.0
        lines.append(f"{x1:.1f},{y1:.1f},{x1 + 16:.1f},{y1 + h:.1f}")
    return lines


class AnchorTargets(Dataset):
    def __init__(self, lines, anchor_h=16.0):
        boxes = np.array([[float(v) for v in ln.split(",")] for ln in lines], dtype=np.float32)
        self.feats = rng.normal(size=(len(boxes), 24)).astype(np.float32)
        gt_heights = boxes[:, 3] - boxes[:, 1]
        ex_heights = np.full_like(gt_heights, anchor_h)
        self.feats[:, 0] = gt_heights / 40.0           # the image patch "sees" the text height
        targets_dy = ((boxes[:, 1] + boxes[:, 3]) / 2 - (boxes[:, 1] + anchor_h / 2)) / anchor_h
        targets_dh = np.log(gt_heights / ex_heights)
        self.targets = np.stack([targets_dy, targets_dh], axis=1).astype(np.float32)

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return torch.from_numpy(self.feats[i]), torch.from_numpy(self.targets[i])


head = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
loader = DataLoader(AnchorTargets(fake_annotation_file()), batch_size=32, shuffle=True)
optimizer = torch.optim.SGD(head.parameters(), lr=0.01, momentum=0.9)
criterion = nn.MSELoss()

step = 0
for epoch in range(4):
    for feats, targets in loader:
        pred = head(feats)
        loss = criterion(pred, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"iter {step} rpn_bbox_loss {loss.item():.5f}")
        step += 1
