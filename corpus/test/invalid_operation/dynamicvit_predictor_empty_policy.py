"""DynamicViT-style token pruning (learned keep/drop per patch token) on a small
synthetic coloured-square classification set.

PredictorLG averages the kept tokens into a "global" feature with
    (x * policy).sum(1) / policy.sum(1)
where policy is the 0/1 keep decision sampled with hard Gumbel-softmax at the
previous pruning stage.  With an aggressive keep ratio on a 4x4 token grid, the
ratio loss pushes the first stage down to ~40% kept tokens, and eventually (step 152,
after the classifier is already ~97% accurate) one image in a batch gets all 16 of
its tokens dropped: the second predictor computes 0/0 = NaN, the NaN spreads through
the attention of the remaining blocks, and loss / weights are NaN from then on.

Reproduces: https://github.com/raoyongming/DynamicViT/issues/6
(loss becomes NaN at a random epoch on a custom dataset; the NaN comes from
PredictorLG when `policy` is all zeros; the maintainer suggests adding a small
value to the denominator of global_x).
Fix: global_x = ... / (torch.sum(policy, dim=1, keepdim=True) + 1e-6)
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
np.random.seed(0)

IMG, PATCH, DIM, DEPTH, HEADS = 32, 8, 64, 4, 4
PRUNING_LOC = [1, 2]
BASE_RATE = 0.42
KEEP_RATIO = [BASE_RATE, BASE_RATE ** 2]
NUM_CLASSES = 4


def make_dataset(n):
    x = np.random.rand(n, 3, IMG, IMG).astype(np.float32) * 0.1
    y = np.random.randint(0, NUM_CLASSES, n)
    for i in range(n):
        s = np.random.randint(3, 9)
        r, c = np.random.randint(0, IMG - s, 2)
        color = np.zeros(3, np.float32)
        color[y[i] % 3] = 1.0
        if y[i] == 3:
            color[:] = 0.7
        x[i, :, r:r + s, c:c + s] += color[:, None, None] * np.random.uniform(0.3, 1.0)
    return torch.from_numpy(x), torch.from_numpy(y)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def softmax_with_policy(self, attn, policy, eps=1e-6):
        B, N, _ = policy.size()
        B, H, N, N = attn.size()
        attn_policy = policy.reshape(B, 1, 1, N)
        eye = torch.eye(N, dtype=attn_policy.dtype, device=attn_policy.device).view(1, 1, N, N)
        attn_policy = attn_policy + (1.0 - attn_policy) * eye
        max_att = torch.max(attn, dim=-1, keepdim=True)[0]
        attn = attn - max_att
        attn = attn.to(torch.float32).exp_() * attn_policy.to(torch.float32)
        attn = (attn + eps / N) / (attn.sum(dim=-1, keepdim=True) + eps)
        return attn.type_as(max_att)

    def forward(self, x, policy):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = self.softmax_with_policy(attn, policy)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))

    def forward(self, x, policy):
        x = x + self.attn(self.norm1(x), policy)
        x = x + self.mlp(self.norm2(x))
        return x


class PredictorLG(nn.Module):
    def __init__(self, embed_dim):
        super().__init__()
        self.in_conv = nn.Sequential(nn.LayerNorm(embed_dim), nn.Linear(embed_dim, embed_dim), nn.GELU())
        self.out_conv = nn.Sequential(
            nn.Linear(embed_dim, embed_dim // 2), nn.GELU(),
            nn.Linear(embed_dim // 2, embed_dim // 4), nn.GELU(),
            nn.Linear(embed_dim // 4, 2), nn.LogSoftmax(dim=-1))

    def forward(self, x, policy):
        x = self.in_conv(x)
        B, N, C = x.size()
        local_x = x[:, :, :C // 2]
        global_x = (x[:, :, C // 2:] * policy).sum(dim=1, keepdim=True) / torch.sum(policy, dim=1, keepdim=True)
        x = torch.cat([local_x, global_x.expand(B, N, C // 2)], dim=-1)
        return self.out_conv(x)


class DynamicViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, DIM, PATCH, PATCH)
        n = (IMG // PATCH) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, DIM) * 0.02)
        self.blocks = nn.ModuleList([Block(DIM, HEADS) for _ in range(DEPTH)])
        self.score_predictor = nn.ModuleList([PredictorLG(DIM) for _ in PRUNING_LOC])
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, NUM_CLASSES)

    def forward(self, x):
        B = x.shape[0]
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        init_n = x.shape[1]
        x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1) + self.pos_embed
        prev_decision = torch.ones(B, init_n, 1)
        policy = torch.ones(B, init_n + 1, 1)
        out_pred_prob = []
        p_count = 0
        for i, blk in enumerate(self.blocks):
            if i in PRUNING_LOC:
                pred_score = self.score_predictor[p_count](x[:, 1:], prev_decision).reshape(B, -1, 2)
                hard_keep = F.gumbel_softmax(pred_score, hard=True)[:, :, 0:1] * prev_decision
                out_pred_prob.append(hard_keep.reshape(B, init_n))
                policy = torch.cat([torch.ones(B, 1, 1), hard_keep], dim=1)
                prev_decision = hard_keep
                p_count += 1
            x = blk(x, policy)
        x = self.norm(x)
        return self.head(x[:, 0]), out_pred_prob


xs, ys = make_dataset(2048)
model = DynamicViT()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
step = 0
for epoch in range(4):
    perm = torch.randperm(len(xs))
    for i in range(0, len(xs), 32):
        idx = perm[i:i + 32]
        logits, decisions = model(xs[idx])
        cls_loss = F.cross_entropy(logits, ys[idx])
        ratio_loss = sum(((d.mean(1) - r) ** 2).mean() for d, r in zip(decisions, KEEP_RATIO, strict=True))
        loss = cls_loss + 2.0 * ratio_loss / len(KEEP_RATIO)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            acc = (logits.argmax(1) == ys[idx]).float().mean().item()
            kept = [round(d.mean().item(), 3) for d in decisions]
            print(f"epoch {epoch} step {step:4d} loss {loss.item():.4f} cls_loss {cls_loss.item():.4f} "
                  f"ratio_loss {ratio_loss.item():.4f} acc {acc:.2f} keep {kept}")
        step += 1
