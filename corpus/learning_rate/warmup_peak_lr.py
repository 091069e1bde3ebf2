"""Box-regression head trained with a linear warm-up + cosine schedule; the peak lr is too high.

Reported in YunYang1994/TensorFlow2.0-Examples#8 ("total_loss: nan?",
https://github.com/YunYang1994/TensorFlow2.0-Examples/issues/8): the log shows the loss
training normally while ``lr`` keeps climbing through the warm-up (0.000598, 0.000599, ...) and
at some step the giou/total loss turns into nan.  The maintainer: the NaN comes from the
learning rate that keeps rising during warm-up, make the learning rate smaller.

Here the warm-up ramps to LR_INIT = 0.5 over two epochs; past lr ~0.1 the SGD + momentum
updates start to overshoot (the loss stops falling and bounces around), and around lr 0.35 it
blows up geometrically and overflows to inf/NaN, well before the end of the warm-up.  With LR_INIT = 0.02 the same script trains to a low loss.
"""
import math

import torch
import torch.nn as nn

torch.manual_seed(0)

LR_INIT = 0.5
LR_END = 1e-5
WARMUP_EPOCHS = 2
EPOCHS = 6
BATCH = 32

# synthetic "feature map -> box offsets" regression data
feats = torch.randn(2048, 64)
true_w = torch.randn(64, 4) * 0.3
boxes = feats @ true_w + 0.05 * torch.randn(2048, 4)

model = nn.Sequential(
    nn.Linear(64, 128), nn.ReLU(),
    nn.Linear(128, 128), nn.ReLU(),
    nn.Linear(128, 4),
)
optimizer = torch.optim.SGD(model.parameters(), lr=LR_INIT, momentum=0.9)

steps_per_epoch = len(feats) // BATCH
warmup_steps = WARMUP_EPOCHS * steps_per_epoch
total_steps = EPOCHS * steps_per_epoch
global_step = 0

for epoch in range(EPOCHS):
    perm = torch.randperm(len(feats))
    for b in range(steps_per_epoch):
        idx = perm[b * BATCH:(b + 1) * BATCH]
        global_step += 1
        if global_step < warmup_steps:
            lr = global_step / warmup_steps * LR_INIT
        else:
            lr = LR_END + 0.5 * (LR_INIT - LR_END) * (
                1 + math.cos((global_step - warmup_steps) / (total_steps - warmup_steps) * math.pi))
        for g in optimizer.param_groups:
            g["lr"] = lr

        pred = model(feats[idx])
        loss = nn.functional.mse_loss(pred, boxes[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"=> STEP {global_step:4d}   lr: {lr:.6f}   total_loss: {loss.item():.4f}")
