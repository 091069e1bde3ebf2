"""FCN-style semantic segmentation with per-iteration label_accuracy_score metrics.

Follows the wkentaro/fcn / pytorch-fcn training loop: a small FCN (VGG-like encoder, score
layer, bilinear-initialised transposed-conv upsampling with a skip), ``cross_entropy2d`` that
drops the void label (-1) before the NLL, Adam, and after every training
iteration the batch is scored with ``label_accuracy_score`` (overall accuracy, mean class
accuracy, mean IU, frequency-weighted accuracy); the validation pass scores the whole
validation set at once.

This looks alarming at first: each synthetic image contains the background and only one or
two of the seven object classes, so for every absent class the confusion-matrix row and
column are empty and its IU (and its class accuracy) is 0/0 = NaN, several NaNs per
iteration.  That is expected: "it is an expected behavior, because iu must be nan for class
labels which does not exist in the ground truth label image" (maintainer in wkentaro/fcn#83,
https://github.com/wkentaro/fcn/issues/83).  The NaNs stay inside the metric, which
computes the divisions under ``np.errstate(divide='ignore', invalid='ignore')`` and averages
with ``np.nanmean``; they never reach the loss or the weights.  The loss falls and every
printed number is finite.
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

N_CLASS = 8          # background + 7 object classes
IMG = 64


# ----------------------------------------------------------------------------- metrics
def _fast_hist(label_true, label_pred, n_class):
    mask = (label_true >= 0) & (label_true < n_class)
    hist = np.bincount(
        n_class * label_true[mask].astype(int) + label_pred[mask],
        minlength=n_class ** 2).reshape(n_class, n_class)
    return hist


def label_accuracy_score(label_trues, label_preds, n_class):
    """Returns accuracy score evaluation result.

      - overall accuracy
      - mean accuracy
      - mean IU
      - fwavacc
    """
    hist = np.zeros((n_class, n_class))
    for lt, lp in zip(label_trues, label_preds):
        hist += _fast_hist(lt.flatten(), lp.flatten(), n_class)
    acc = np.diag(hist).sum() / hist.sum()
    with np.errstate(divide='ignore', invalid='ignore'):
        acc_cls = np.diag(hist) / hist.sum(axis=1)
    acc_cls = np.nanmean(acc_cls)
    with np.errstate(divide='ignore', invalid='ignore'):
        iu = np.diag(hist) / (hist.sum(axis=1) + hist.sum(axis=0) - np.diag(hist))
    mean_iu = np.nanmean(iu)
    freq = hist.sum(axis=1) / hist.sum()
    fwavacc = (freq[freq > 0] * iu[freq > 0]).sum()
    return acc, acc_cls, mean_iu, fwavacc


# ----------------------------------------------------------------------------- data
class ShapesSegmentation(torch.utils.data.Dataset):
    """VOC-like synthetic scenes: background plus one or two coloured shapes; a one-pixel
    band around each object is labelled -1 (void), like the 255 border in VOC."""

    mean_bgr = np.array([104.00698793, 116.66876762, 122.67891434])
    colours = np.array([[200, 60, 60], [60, 200, 60], [60, 60, 200], [200, 200, 60],
                        [200, 60, 200], [60, 200, 200], [230, 140, 40]], dtype=np.float64)

    def __init__(self, n, seed):
        rng = np.random.RandomState(seed)
        yy, xx = np.mgrid[0:IMG, 0:IMG]
        self.items = []
        for _ in range(n):
            img = rng.normal(120, 12, size=(IMG, IMG, 3))
            lbl = np.zeros((IMG, IMG), dtype=np.int32)
            for cls in rng.choice(np.arange(1, N_CLASS), size=rng.randint(1, 3), replace=False):
                cy, cx = rng.randint(12, IMG - 12, size=2)
                ry, rx = rng.randint(6, 14, size=2)
                if cls % 2:
                    inside = (np.abs(yy - cy) <= ry) & (np.abs(xx - cx) <= rx)
                else:
                    inside = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
                outer = (np.abs(yy - cy) <= ry + 1) & (np.abs(xx - cx) <= rx + 1) if cls % 2 else \
                    ((yy - cy) / (ry + 1)) ** 2 + ((xx - cx) / (rx + 1)) ** 2 <= 1
                img[inside] = self.colours[cls - 1] + rng.normal(0, 8, size=3)
                lbl[outer & ~inside] = -1
                lbl[inside] = cls
            self.items.append((img, lbl))

    def __len__(self):
        return len(self.items)

    def transform(self, img, lbl):
        img = img[:, :, ::-1] - self.mean_bgr      # RGB -> BGR, subtract mean
        img = torch.from_numpy(img.transpose(2, 0, 1).copy()).float()
        return img, torch.from_numpy(lbl).long()

    def __getitem__(self, index):
        return self.transform(*self.items[index])


# ----------------------------------------------------------------------------- model
def get_upsampling_weight(in_channels, out_channels, kernel_size):
    """Make a 2D bilinear kernel suitable for upsampling"""
    factor = (kernel_size + 1) // 2
    center = factor - 1 if kernel_size % 2 == 1 else factor - 0.5
    og = np.ogrid[:kernel_size, :kernel_size]
    filt = (1 - abs(og[0] - center) / factor) * (1 - abs(og[1] - center) / factor)
    weight = np.zeros((in_channels, out_channels, kernel_size, kernel_size), dtype=np.float64)
    weight[range(in_channels), range(out_channels), :, :] = filt
    return torch.from_numpy(weight).float()


class FCN16sLite(nn.Module):
    def __init__(self, n_class=N_CLASS):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(inplace=True),
                                 nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(inplace=True),
                                 nn.MaxPool2d(2, stride=2, ceil_mode=True))
        self.block1 = block(3, 16)     # 1/2
        self.block2 = block(16, 32)    # 1/4
        self.block3 = block(32, 48)    # 1/8
        self.block4 = block(48, 64)    # 1/16
        self.fc = nn.Sequential(nn.Conv2d(64, 128, 1), nn.ReLU(inplace=True), nn.Dropout2d())
        self.score_fr = nn.Conv2d(128, n_class, 1)
        self.score_pool3 = nn.Conv2d(48, n_class, 1)
        self.upscore2 = nn.ConvTranspose2d(n_class, n_class, 4, stride=2, padding=1, bias=False)
        self.upscore8 = nn.ConvTranspose2d(n_class, n_class, 16, stride=8, padding=4, bias=False)
        self._initialize_weights()

    def _initialize_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, nonlinearity='relu')
                nn.init.zeros_(m.bias)
            if isinstance(m, nn.ConvTranspose2d):
                m.weight.data.copy_(get_upsampling_weight(m.in_channels, m.out_channels,
                                                          m.kernel_size[0]))
        nn.init.zeros_(self.score_fr.weight)
        nn.init.zeros_(self.score_pool3.weight)

    def forward(self, x):
        pool3 = self.block3(self.block2(self.block1(x)))
        h = self.score_fr(self.fc(self.block4(pool3)))
        h = self.upscore2(h) + self.score_pool3(pool3)
        return self.upscore8(h)


def cross_entropy2d(input, target, weight=None, size_average=True):
    # input: (n, c, h, w), target: (n, h, w)
    n, c, h, w = input.size()
    log_p = F.log_softmax(input, dim=1)
    log_p = log_p.transpose(1, 2).transpose(2, 3).contiguous()
    log_p = log_p[target.view(n, h, w, 1).repeat(1, 1, 1, c) >= 0]
    log_p = log_p.view(-1, c)
    mask = target >= 0
    target = target[mask]
    loss = F.nll_loss(log_p, target, weight=weight, reduction='sum')
    if size_average:
        loss /= mask.data.sum()
    return loss


# ----------------------------------------------------------------------------- trainer
class Trainer:
    def __init__(self, model, optimizer, train_loader, val_loader, max_epoch, interval=10):
        self.model = model
        self.optim = optimizer
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.max_epoch = max_epoch
        self.interval = interval
        self.iteration = 0

    def validate(self, epoch):
        self.model.eval()
        val_loss, label_trues, label_preds = 0.0, [], []
        with torch.no_grad():
            for data, target in self.val_loader:
                score = self.model(data)
                val_loss += float(cross_entropy2d(score, target)) / len(self.val_loader)
                label_preds.extend(score.max(1)[1].numpy())
                label_trues.extend(target.numpy())
        acc, acc_cls, mean_iu, fwavacc = label_accuracy_score(label_trues, label_preds, N_CLASS)
        print('[val]   epoch %d  loss %.4f  acc %.4f  acc_cls %.4f  mean_iu %.4f  fwavacc %.4f'
              % (epoch, val_loss, acc, acc_cls, mean_iu, fwavacc))
        self.model.train()

    def train_epoch(self, epoch):
        self.model.train()
        for batch_idx, (data, target) in enumerate(self.train_loader):
            self.optim.zero_grad()
            score = self.model(data)
            loss = cross_entropy2d(score, target)
            loss_data = loss.item()
            if math.isnan(loss_data):
                raise ValueError('loss is nan while training')
            loss.backward()
            self.optim.step()

            metrics = []
            lbl_pred = score.data.max(1)[1].numpy()
            lbl_true = target.numpy()
            for lt, lp in zip(lbl_true, lbl_pred):
                metrics.append(label_accuracy_score([lt], [lp], n_class=N_CLASS))
            metrics = np.mean(metrics, axis=0)
            if self.iteration % self.interval == 0:
                print('[train] epoch %d iter %4d  loss %.4f  acc %.4f  acc_cls %.4f  mean_iu %.4f  '
                      'fwavacc %.4f' % ((epoch, self.iteration, loss_data) + tuple(metrics)))
            self.iteration += 1

    def train(self):
        for epoch in range(self.max_epoch):
            self.train_epoch(epoch)
            self.validate(epoch)


def main():
    torch.manual_seed(1337)
    torch.set_num_threads(1)
    train_loader = torch.utils.data.DataLoader(ShapesSegmentation(320, seed=0), batch_size=8,
                                               shuffle=True)
    val_loader = torch.utils.data.DataLoader(ShapesSegmentation(64, seed=1), batch_size=16,
                                             shuffle=False)
    model = FCN16sLite()
    optim = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=5e-4)
    Trainer(model, optim, train_loader, val_loader, max_epoch=4).train()


if __name__ == '__main__':
    main()
