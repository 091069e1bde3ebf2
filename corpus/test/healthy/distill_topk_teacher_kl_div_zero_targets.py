"""Knowledge distillation with top-k truncated teacher distributions (healthy run).

The teacher's soft labels are cached as top-k logits only: every other class is
masked with -inf before the softmax, so most entries of the target distribution
are exactly 0.  The student is trained with F.kl_div(log_softmax(student/T),
teacher_probs, reduction="batchmean").  At first sight this looks like it must
produce 0 * log(0) = NaN for the masked classes, but KLDivLoss computes the
pointwise term with xlogy semantics, so zero-target entries contribute exactly
0 (and zero gradient); the loss stays finite for the whole run.  The -inf
teacher logits never reach the student's graph.

Reference: PyTorch documentation of torch.nn.KLDivLoss / F.kl_div
(https://pytorch.org/docs/stable/generated/torch.nn.KLDivLoss.html) - the
pointwise loss is target * (log target - input), with 0 * log 0 taken as 0.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)

NUM_CLASSES = 50
TOP_K = 5
TEMPERATURE = 2.0
ALPHA = 0.7

# ---- synthetic data + cached teacher outputs ----------------------------------
centers = torch.randn(NUM_CLASSES, 32) * 2.0
labels = torch.randint(0, NUM_CLASSES, (4096,))
inputs = centers[labels] + torch.randn(4096, 32)

with torch.no_grad():
    # stand-in for the big teacher's cached logits
    t_logits = inputs @ centers.t() / 4.0 + 0.5 * torch.randn(4096, NUM_CLASSES)
    # cache only the teacher's top-k logits (the usual trick to keep soft labels small)
    topk = t_logits.topk(TOP_K, dim=1)
    sparse_logits = torch.full_like(t_logits, float("-inf"))
    sparse_logits.scatter_(1, topk.indices, topk.values)
    teacher_probs = F.softmax(sparse_logits / TEMPERATURE, dim=1)   # exact zeros outside top-k

print(f"fraction of zero teacher probabilities: {(teacher_probs == 0).float().mean():.3f}")

loader = DataLoader(TensorDataset(inputs, labels, teacher_probs), batch_size=64, shuffle=True)

student = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, NUM_CLASSES))
optimizer = torch.optim.AdamW(student.parameters(), lr=3e-3, weight_decay=1e-4)

step = 0
for epoch in range(4):
    for x, y, p_t in loader:
        s_logits = student(x)
        kd = F.kl_div(F.log_softmax(s_logits / TEMPERATURE, dim=1), p_t,
                      reduction="batchmean") * TEMPERATURE ** 2
        ce = F.cross_entropy(s_logits, y)
        loss = ALPHA * kd + (1 - ALPHA) * ce
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"epoch {epoch} step {step:4d}  loss {loss.item():.4f}  kd {kd.item():.4f}  ce {ce.item():.4f}")
        step += 1

with torch.no_grad():
    acc = (student(inputs).argmax(1) == labels).float().mean()
print(f"final train accuracy {acc:.3f}")
