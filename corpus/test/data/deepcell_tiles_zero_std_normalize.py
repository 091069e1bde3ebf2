"""Foreground/background segmentation of nuclei on tiled fluorescence images.

Setting (deepcell-style pipeline, PyTorch instead of Keras): raw fluorescence
frames come from two microscopes with different fields of view, so they are
zero-padded onto a common 128x128 canvas, cut into 32x32 training tiles, and
every tile/channel is z-scored with the toolbox's `normalize()` before a
small fully-convolutional net is trained to predict the fgbg mask.

Bug: `normalize()` divides by `img.std()` with no guard.  A tile that lies
completely inside the zero padding is constant, so its std is exactly 0 and
the tile becomes 0/0 = NaN.  Only four of the 640 tiles are like that, so
the first batches train normally; the loss turns NaN at the first batch that
draws one of those tiles, and Adam then writes NaN into every weight.

Fix (vanvalenlab/deepcell-toolbox PR #72, fixing issue #71 "normalize has no
epsilon in the denominator"): add an epsilon to the denominator,
`(img - img.mean()) / (img.std() + epsilon)` with epsilon = 1e-7.

Report: https://github.com/vanvalenlab/deepcell-toolbox/pull/72
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


CONFIG = {
    'seed': 9,
    'n_images': 40,          # frames from the large-field scope
    'canvas': 128,           # common shape every frame is padded to
    'small_fov': (112, 96),  # one frame from the small-field scope (h, w)
    'tile_size': 32,
    'n_nuclei': (6, 14),
    'batch_size': 16,
    'epochs': 2,
    'lr': 1e-3,
    'n_features': 16,
}


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------
def make_frame(rng, shape, n_nuclei):
    """One channel of fluorescence: bright blobs on a dim noisy background."""
    h, w = shape
    yy, xx = np.mgrid[0:h, 0:w]
    img = rng.normal(80.0, 6.0, size=shape)
    mask = np.zeros(shape, dtype='int32')
    for k in range(rng.integers(*n_nuclei)):
        cy, cx = rng.uniform(6, h - 6), rng.uniform(6, w - 6)
        r = rng.uniform(3.0, 6.0)
        d2 = (yy - cy) ** 2 + (xx - cx) ** 2
        img += rng.uniform(300, 900) * np.exp(-d2 / (2 * r ** 2))
        mask[d2 < r ** 2] = k + 1
    return img.astype('float32'), mask


def load_raw_data(cfg):
    rng = np.random.default_rng(cfg['seed'])
    X, y = [], []
    for i in range(cfg['n_images']):
        shape = cfg['small_fov'] if i == 17 else (cfg['canvas'], cfg['canvas'])
        img, mask = make_frame(rng, shape, cfg['n_nuclei'])
        X.append(img[..., None])
        y.append(mask[..., None])
    return X, y


def pad_to_canvas(frames, canvas):
    """Stack frames of different sizes by zero-padding bottom/right."""
    out = np.zeros((len(frames), canvas, canvas, frames[0].shape[-1]),
                   dtype=frames[0].dtype)
    for i, f in enumerate(frames):
        out[i, :f.shape[0], :f.shape[1]] = f
    return out


def tile_image(image, tile_size):
    """(N, H, W, C) -> (N * H/t * W/t, t, t, C), non-overlapping tiles."""
    n, h, w, c = image.shape
    t = tile_size
    tiles = image.reshape(n, h // t, t, w // t, t, c).transpose(0, 1, 3, 2, 4, 5)
    return tiles.reshape(-1, t, t, c)


def normalize(image):
    """Z-score each image / channel (deepcell_toolbox.processing.normalize)."""
    for batch in range(image.shape[0]):
        for channel in range(image.shape[-1]):
            img = image[batch, ..., channel]
            normal_image = (img - img.mean()) / img.std()
            image[batch, ..., channel] = normal_image
    return image


def fgbg_transform(y):
    return (y > 0).astype('int64')[..., 0]


# ---------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------
class FGBGNet(nn.Module):
    def __init__(self, n_features):
        super().__init__()
        self.conv1 = nn.Conv2d(1, n_features, 3, padding=1)
        self.conv2 = nn.Conv2d(n_features, n_features, 3, padding=2, dilation=2)
        self.conv3 = nn.Conv2d(n_features, n_features, 3, padding=4, dilation=4)
        self.head = nn.Conv2d(n_features, 2, 1)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return self.head(x)


def train(cfg):
    torch.manual_seed(cfg['seed'])
    X_raw, y_raw = load_raw_data(cfg)
    X = tile_image(pad_to_canvas(X_raw, cfg['canvas']), cfg['tile_size'])
    y = tile_image(pad_to_canvas(y_raw, cfg['canvas']), cfg['tile_size'])
    X = normalize(X)
    y = fgbg_transform(y)
    print('X_train.shape: {}  y_train.shape: {}'.format(X.shape, y.shape))

    X_t = torch.from_numpy(np.ascontiguousarray(X.transpose(0, 3, 1, 2)))
    y_t = torch.from_numpy(y)

    model = FGBGNet(cfg['n_features'])
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg['lr'])
    class_weights = torch.tensor([1.0, 3.0])

    n = X_t.shape[0]
    steps = n // cfg['batch_size']
    gen = torch.Generator().manual_seed(cfg['seed'])
    for epoch in range(cfg['epochs']):
        perm = torch.randperm(n, generator=gen)
        running = 0.0
        for step in range(steps):
            idx = perm[step * cfg['batch_size']:(step + 1) * cfg['batch_size']]
            logits = model(X_t[idx])
            loss = F.cross_entropy(logits, y_t[idx], weight=class_weights)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running += loss.item()
            print('Epoch {}/{} - step {:3d}/{} - loss: {:.4f}'.format(
                epoch + 1, cfg['epochs'], step + 1, steps, loss.item()))
        print('Epoch {} mean loss: {:.4f}'.format(epoch + 1, running / steps))


if __name__ == '__main__':
    train(CONFIG)
