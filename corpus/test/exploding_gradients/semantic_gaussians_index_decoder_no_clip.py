"""Language-embedded point/Gaussian field: semantic index decoder trained without clipping.

Every point carries a small learnable semantic feature; features are splatted into the
image with fixed per-pixel blending weights and an `index_decoder` MLP maps the rendered
feature of each pixel to a codebook index (cross-entropy, as in LEGaussians).  The
semantic term is summed with the colour reconstruction / smoothness terms with a large
weight.  Nothing bounds the gradients of the index decoder: after a few hundred iterations
the decoder and the point features feed each other, a gradient spike throws the weights far
away, the logits blow up and the semantic loss turns into nan (later inf/nan everywhere).

Report: https://github.com/buaavrcg/LEGaussians/issues/12 ("After training for several
epochs, the semantic loss will be nan").
Fix (from the thread, issue closed as solved): clip the gradient of the index decoder after
total_loss.backward():
    torch.nn.utils.clip_grad_norm_(index_decoder.parameters(), max_norm=1)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)

N_POINTS = 1024
FEAT_DIM = 8
CODEBOOK = 64
H = W = 16
N_VIEWS = 12
ITERS = 600


class IndexDecoder(nn.Module):
    def __init__(self, in_dim=FEAT_DIM, hidden=128, n_codes=CODEBOOK):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.LeakyReLU(0.1),
            nn.Linear(hidden, hidden), nn.LeakyReLU(0.1),
            nn.Linear(hidden, hidden), nn.LeakyReLU(0.1),
            nn.Linear(hidden, n_codes),
        )

    def forward(self, x):
        return self.net(x)


def make_scene():
    """Fixed splatting weights per view plus ground-truth colours and codebook indices."""
    views = []
    xyz = torch.rand(N_POINTS, 2)
    gt_code_of_point = (xyz[:, 0] * 8).long() * 8 + (xyz[:, 1] * 8).long()
    gt_rgb_of_point = torch.rand(N_POINTS, 3)
    for v in range(N_VIEWS):
        shift = torch.rand(2) * 0.2
        pix = torch.stack(torch.meshgrid(torch.linspace(0, 1, H), torch.linspace(0, 1, W),
                                         indexing="ij"), -1).reshape(-1, 2)
        d2 = ((pix[:, None, :] - (xyz[None] + shift) % 1.0) ** 2).sum(-1)
        wts = torch.exp(-d2 / 0.002)
        wts = wts / (wts.sum(1, keepdim=True) + 1e-6)       # alpha-blending weights
        nearest = d2.argmin(1)
        views.append((wts, gt_rgb_of_point[nearest], gt_code_of_point[nearest]))
    return views


def main():
    views = make_scene()
    sem_feat = nn.Parameter(torch.randn(N_POINTS, FEAT_DIM) * 0.1)
    rgb = nn.Parameter(torch.rand(N_POINTS, 3))
    index_decoder = IndexDecoder()

    reconstruction_loss_weight = 1.0
    semantic_loss_weight = 10.0
    smooth_loss_weight = 0.1

    optimizer = torch.optim.SGD([
        {"params": [rgb], "lr": 1.0},
        {"params": [sem_feat], "lr": 1.0},
        {"params": index_decoder.parameters(), "lr": 0.1},
    ], momentum=0.9)

    for it in range(1, ITERS + 1):
        wts, gt_rgb, gt_code = views[it % N_VIEWS]
        render_rgb = wts @ rgb
        render_sem = wts @ sem_feat
        logits = index_decoder(render_sem)

        loss = F.l1_loss(render_rgb, gt_rgb)
        semantic_loss = F.cross_entropy(logits, gt_code)
        smooth_loss = (render_sem.reshape(H, W, -1).diff(dim=0) ** 2).mean()

        total_loss = (reconstruction_loss_weight * loss
                      + semantic_loss_weight * semantic_loss
                      + smooth_loss_weight * smooth_loss)

        optimizer.zero_grad()
        total_loss.backward()
        optimizer.step()

        if it % 25 == 0:
            acc = (logits.argmax(1) == gt_code).float().mean().item()
            print(f"[ITER {it}] total {total_loss.item():.4f} rgb {loss.item():.4f} "
                  f"semantic {semantic_loss.item():.4f} acc {acc:.3f}")


if __name__ == "__main__":
    main()
