"""Mixed-precision (float16 autocast) training with dynamic loss scaling via GradScaler.

The scaler starts at a deliberately large scale (2**24).  The first backward passes overflow
in float16, GradScaler detects the non-finite gradients, skips those optimizer steps and
halves the scale until the gradients fit; from then on training proceeds normally.  Skipped
steps are the documented, intended behaviour of torch.amp.GradScaler, not a failure.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)

model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 5))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24, growth_interval=50)

w_true = torch.randn(32, 5)
skipped = 0
for step in range(120):
    x = torch.randn(64, 32)
    y = (x @ w_true).argmax(dim=1)
    with torch.autocast("cpu", dtype=torch.float16):
        logits = model(x)
    loss = F.cross_entropy(logits.float(), y)
    opt.zero_grad()
    scale_before = scaler.get_scale()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    if scaler.get_scale() < scale_before:
        skipped += 1
        print(f"step {step:3d}  overflow in scaled grads, step skipped, scale now {scaler.get_scale():.0f}")
    elif step % 10 == 0:
        print(f"step {step:3d}  loss {loss.item():.4f}  scale {scaler.get_scale():.0f}")
print(f"done: {skipped} skipped steps, final loss {loss.item():.4f}")
