"""FCN-32s semantic segmentation trained with a per-pixel *summed* loss and lr = 1e-4.

Reproduces https://github.com/wkentaro/pytorch-fcn/issues/17 ("Nan error while training"): the
reporter set the learning rate of the pytorch-fcn training script to 1e-4 ("lr=1e4", the value of
the FCN paper) and training raised the nan-loss error, while the lr of the original script trained
fine.  In the thread, the lr the reporter took from the paper turns out to belong to a
pixel-normalised loss, whereas the script calls cross_entropy2d(..., size_average=False): the loss
is summed over every pixel of the image (batch size 1, as in the PAMI FCN paper).  The
maintainer's answer: "You need to tune the learning rate when you change the loss func." The
script's own value for the summed loss is lr=1.0e-10 (SGD, momentum 0.99).

Here a small VGG-style FCN-32s (conv blocks with padding=100 on the first conv, fc6/fc7 as
convolutions, score_fr, a bilinear-initialised 64x stride-32 deconvolution and the offset crop)
is trained on synthetic VOC-like images (mean-subtracted BGR, 0..255 scale) with 21 classes and
an ignore label of -1.  With lr 1e-4 on the summed loss SGD + momentum 0.99 blows up within a few
iterations: the printed loss reaches ~1e35 and then nan, and the trainer's nan check raises
ValueError('loss is nan while training') (the "nan error" of the report).

Fix: use a learning rate sized for the summed loss (the original 1.0e-10 of the script), or
normalise the loss by the number of labelled pixels if lr 1e-4 is wanted.
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

configurations = {
    # same configuration as the original work
    # https://github.com/shelhamer/fcn.berkeleyvision.org
    1: dict(
        max_iteration=40,
        lr=1.0e-4,
        momentum=0.99,
        weight_decay=0.0005,
        interval_validate=4000,
    )
}

N_CLASS = 21
MEAN_BGR = np.array([104.00698793, 116.66876762, 122.67891434])


def make_voc_like_sample(rng, h=64, w=64):
    """Random background with a few coloured rectangles / discs, each its own class."""
    img = rng.uniform(0, 255, size=(h, w, 3)) * 0.3 + rng.uniform(60, 180, size=3)
    lbl = np.zeros((h, w), dtype=np.int64)
    yy, xx = np.mgrid[:h, :w]
    for _ in range(rng.integers(1, 4)):
        cls = rng.integers(1, N_CLASS)
        color = rng.uniform(0, 255, size=3)
        if rng.random() < 0.5:
            y0, x0 = rng.integers(0, h - 16), rng.integers(0, w - 16)
            y1, x1 = y0 + rng.integers(10, 30), x0 + rng.integers(10, 30)
            m = (yy >= y0) & (yy < y1) & (xx >= x0) & (xx < x1)
        else:
            cy, cx, r = rng.integers(10, h - 10), rng.integers(10, w - 10), rng.integers(5, 14)
            m = (yy - cy) ** 2 + (xx - cx) ** 2 < r ** 2
        img[m] = 0.7 * color + 0.3 * img[m]
        lbl[m] = cls
        # VOC marks object boundaries with 255 (-> -1, ignored)
        edge = m & ~np.roll(m, 1, 0) | m & ~np.roll(m, 1, 1)
        lbl[edge] = -1
    return img.astype(np.float64), lbl


def transform(img, lbl):
    img = img[:, :, ::-1]  # RGB -> BGR
    img = img - MEAN_BGR
    img = img.transpose(2, 0, 1)
    img = torch.from_numpy(img.copy()).float()
    lbl = torch.from_numpy(lbl).long()
    return img, lbl


def get_upsampling_weight(in_channels, out_channels, kernel_size):
    """Make a 2D bilinear kernel suitable for upsampling"""
    factor = (kernel_size + 1) // 2
    if kernel_size % 2 == 1:
        center = factor - 1
    else:
        center = factor - 0.5
    og = np.ogrid[:kernel_size, :kernel_size]
    filt = (1 - abs(og[0] - center) / factor) * (1 - abs(og[1] - center) / factor)
    weight = np.zeros((in_channels, out_channels, kernel_size, kernel_size), dtype=np.float64)
    weight[range(in_channels), range(out_channels), :, :] = filt
    return torch.from_numpy(weight).float()


class FCN32s(nn.Module):

    def __init__(self, n_class=21):
        super(FCN32s, self).__init__()
        # conv1
        self.conv1_1 = nn.Conv2d(3, 16, 3, padding=100)
        self.conv1_2 = nn.Conv2d(16, 16, 3, padding=1)
        self.pool1 = nn.MaxPool2d(2, stride=2, ceil_mode=True)  # 1/2
        # conv2
        self.conv2_1 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv2_2 = nn.Conv2d(32, 32, 3, padding=1)
        self.pool2 = nn.MaxPool2d(2, stride=2, ceil_mode=True)  # 1/4
        # conv3
        self.conv3_1 = nn.Conv2d(32, 32, 3, padding=1)
        self.conv3_2 = nn.Conv2d(32, 32, 3, padding=1)
        self.pool3 = nn.MaxPool2d(2, stride=2, ceil_mode=True)  # 1/8
        # conv4
        self.conv4_1 = nn.Conv2d(32, 64, 3, padding=1)
        self.pool4 = nn.MaxPool2d(2, stride=2, ceil_mode=True)  # 1/16
        # conv5
        self.conv5_1 = nn.Conv2d(64, 64, 3, padding=1)
        self.pool5 = nn.MaxPool2d(2, stride=2, ceil_mode=True)  # 1/32
        # fc6
        self.fc6 = nn.Conv2d(64, 128, 7)
        self.drop6 = nn.Dropout2d()
        # fc7
        self.fc7 = nn.Conv2d(128, 128, 1)
        self.drop7 = nn.Dropout2d()

        self.score_fr = nn.Conv2d(128, n_class, 1)
        self.upscore = nn.ConvTranspose2d(n_class, n_class, 64, stride=32, bias=False)

        self._initialize_weights()

    def _initialize_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                if m is self.score_fr:
                    m.weight.data.zero_()
                    m.bias.data.zero_()
                else:
                    nn.init.kaiming_normal_(m.weight, nonlinearity='relu')
                    m.bias.data.zero_()
            if isinstance(m, nn.ConvTranspose2d):
                assert m.kernel_size[0] == m.kernel_size[1]
                initial_weight = get_upsampling_weight(
                    m.in_channels, m.out_channels, m.kernel_size[0])
                m.weight.data.copy_(initial_weight)

    def forward(self, x):
        h = x
        h = F.relu(self.conv1_1(h))
        h = F.relu(self.conv1_2(h))
        h = self.pool1(h)
        h = F.relu(self.conv2_1(h))
        h = F.relu(self.conv2_2(h))
        h = self.pool2(h)
        h = F.relu(self.conv3_1(h))
        h = F.relu(self.conv3_2(h))
        h = self.pool3(h)
        h = F.relu(self.conv4_1(h))
        h = self.pool4(h)
        h = F.relu(self.conv5_1(h))
        h = self.pool5(h)
        h = self.drop6(F.relu(self.fc6(h)))
        h = self.drop7(F.relu(self.fc7(h)))
        h = self.score_fr(h)
        h = self.upscore(h)
        h = h[:, :, 19:19 + x.size()[2], 19:19 + x.size()[3]].contiguous()
        return h


def get_parameters(model, bias=False):
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            if bias:
                yield m.bias
            else:
                yield m.weight
        elif isinstance(m, nn.ConvTranspose2d):
            # weight is frozen because it is just a bilinear upsampling
            if bias:
                assert m.bias is None


def cross_entropy2d(input, target, weight=None, size_average=True):
    # input: (n, c, h, w), target: (n, h, w)
    n, c, h, w = input.size()
    log_p = F.log_softmax(input, dim=1)
    # log_p: (n*h*w, c)
    log_p = log_p.transpose(1, 2).transpose(2, 3).contiguous()
    log_p = log_p[target.view(n, h, w, 1).repeat(1, 1, 1, c) >= 0]
    log_p = log_p.view(-1, c)
    # target: (n*h*w,)
    mask = target >= 0
    target = target[mask]
    loss = F.nll_loss(log_p, target, weight=weight, reduction='sum')
    if size_average:
        loss /= mask.data.sum()
    return loss


def main():
    torch.manual_seed(1337)
    np.random.seed(1337)
    rng = np.random.default_rng(1337)
    cfg = configurations[1]

    train_set = [transform(*make_voc_like_sample(rng)) for _ in range(32)]

    model = FCN32s(n_class=N_CLASS)
    model.upscore.weight.requires_grad_(False)
    optim = torch.optim.SGD(
        [
            {'params': get_parameters(model, bias=False)},
            {'params': get_parameters(model, bias=True),
             'lr': cfg['lr'] * 2, 'weight_decay': 0},
        ],
        lr=cfg['lr'],
        momentum=cfg['momentum'],
        weight_decay=cfg['weight_decay'])

    model.train()
    iteration = 0
    while iteration < cfg['max_iteration']:
        for img, lbl in train_set:
            if iteration >= cfg['max_iteration']:
                break
            data, target = img.unsqueeze(0), lbl.unsqueeze(0)  # batch_size = 1
            optim.zero_grad()
            score = model(data)
            loss = cross_entropy2d(score, target, size_average=False)
            loss_data = loss.item()
            lbl_pred = score.argmax(1)
            acc = (lbl_pred[target >= 0] == target[target >= 0]).float().mean().item()
            print('iteration=%d loss=%f acc=%.3f' % (iteration, loss_data, acc))
            if np.isnan(loss_data):
                raise ValueError('loss is nan while training')
            loss.backward()
            optim.step()
            iteration += 1


if __name__ == '__main__':
    main()
