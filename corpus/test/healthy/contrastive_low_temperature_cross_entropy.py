"""Two-tower CLIP-style contrastive training on paired synthetic "image" and "caption" data.

A fixed, very low temperature (0.005) is used, so the similarity logits start above
100 -- exp() of them would overflow float32 -- but the symmetric InfoNCE loss is
computed with F.cross_entropy, whose log-softmax subtracts the row maximum first.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = dict(n_concepts=4096, img_dim=128, vocab=2000, caption_len=8, embed=64,
              batch_size=128, steps=400, lr=1e-3, temperature=0.005)


def make_pairs(cfg, n, g):
    concept_img = torch.randn(cfg["n_concepts"], cfg["img_dim"], generator=g)
    concept_words = torch.randint(1, cfg["vocab"], (cfg["n_concepts"], 4), generator=g)
    c = torch.randint(0, cfg["n_concepts"], (n,), generator=g)
    style = torch.randn(n, 2, generator=g)
    images = concept_img[c] + 0.5 * torch.randn(n, cfg["img_dim"], generator=g)
    images[:, :2] += 2.0 * style
    filler = torch.randint(1, cfg["vocab"], (n, cfg["caption_len"] - 4), generator=g)
    captions = torch.cat([concept_words[c], filler], dim=1)
    captions = captions[:, torch.randperm(cfg["caption_len"], generator=g)]
    return images, captions


class ImageTower(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(cfg["img_dim"], 256), nn.GELU(), nn.Linear(256, cfg["embed"]))

    def forward(self, x):
        return F.normalize(self.mlp(x), dim=-1)


class TextTower(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok = nn.EmbeddingBag(cfg["vocab"], 128, mode="mean")
        self.proj = nn.Sequential(nn.GELU(), nn.Linear(128, cfg["embed"]))

    def forward(self, ids):
        return F.normalize(self.proj(self.tok(ids)), dim=-1)


class CLIPLite(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.image, self.text = ImageTower(cfg), TextTower(cfg)
        self.temperature = cfg["temperature"]

    def forward(self, images, captions):
        img, txt = self.image(images), self.text(captions)
        logits = img @ txt.t() / self.temperature
        return logits, logits.t()


def clip_loss(logits_per_image, logits_per_text):
    labels = torch.arange(logits_per_image.shape[0])
    return 0.5 * (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels))


def train(cfg=CONFIG):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    images, captions = make_pairs(cfg, 8192, g)
    model = CLIPLite(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.1)
    for step in range(cfg["steps"]):
        idx = torch.randint(0, len(images), (cfg["batch_size"],), generator=g)
        li, lt = model(images[idx], captions[idx])
        loss = clip_loss(li, lt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            acc = (li.argmax(1) == torch.arange(len(idx))).float().mean().item()
            print(f"step {step:3d} loss {loss.item():.4f} "
                  f"max|logit| {li.abs().max().item():6.2f} i2t_acc {acc:.3f}")


if __name__ == "__main__":
    train()
