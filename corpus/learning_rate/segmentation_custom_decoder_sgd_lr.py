"""Semantic-segmentation training in the style of CSAILVision/semantic-segmentation-pytorch (2018
train.py: argparse options, ModelBuilder-style encoder/decoder with kaiming weights_init,
SegmentationModule wrapping an NLLLoss(ignore_index=-1) on log_softmax output, one SGD optimizer
per net with bias/BN groups excluded from weight decay, poly learning-rate decay).

Setting: the reporter replaced the library decoder by a self-defined one and trained it from
scratch with its own learning rate.  Here the self-defined decoder is a PPM-like head that
concatenates the encoder's fc_dim map with pooled context and maps it to class scores with a
3x3 conv followed by a 1x1 conv (no BatchNorm, no non-linearity in between), and --lr_decoder is
set ten times above --lr_encoder (2e-1 vs 2e-2, momentum 0.9) because the decoder is new.
Synthetic images: class-coloured 8x8 blocks plus noise, label maps at 1/8 resolution
(segm_downsampling_rate 8), first label row ignored (-1).

Bug: the decoder learning rate is far too large.  The 3x3 conv has a fan-in of ~6900
un-normalised ReLU features, so every SGD step overshoots; the two stacked linear convs feed
each other's gradients and their weights grow geometrically (max |w| from ~1 to ~5e15 within
~11 iterations; the printed loss goes 2.7 -> 139 -> 464 -> 5e3 -> 5e4 -> 1e10 at iterations
0..10), until the class scores overflow to inf in the forward pass and log_softmax / NLLLoss
return nan at iteration 12 ("Loss appears NaN" even with log_softmax + NLLLoss, as the reporter
wrote).

Fix (maintainer: "Try with a smaller learning rate, or even zero, to see if your model is
correctly defined"; reporter: "After modifying my learning rate to 1e-7, it works"): lower the
decoder learning rate (--lr_decoder).  With --lr_decoder 2e-3 the same script trains with a
finite, decreasing loss.

Report: https://github.com/CSAILVision/semantic-segmentation-pytorch/issues/59
"""
# System libs
import time
import argparse
# Numerical libs
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class AverageMeter(object):
    def __init__(self):
        self.val, self.sum, self.count = 0., 0., 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n

    def average(self):
        return self.sum / max(self.count, 1)


def conv3x3_bn_relu(in_planes, out_planes, stride=1, dilation=1):
    return nn.Sequential(
        nn.Conv2d(in_planes, out_planes, 3, stride, padding=dilation, dilation=dilation, bias=False),
        nn.BatchNorm2d(out_planes),
        nn.ReLU(inplace=True))


class DilatedEncoder(nn.Module):
    """A small stand-in for resnet50_dilated8: stride 8, dilated last stage, fc_dim channels."""

    def __init__(self, fc_dim=256):
        super(DilatedEncoder, self).__init__()
        self.layer1 = nn.Sequential(conv3x3_bn_relu(3, 16, 2), conv3x3_bn_relu(16, 16))
        self.layer2 = nn.Sequential(conv3x3_bn_relu(16, 32, 2), conv3x3_bn_relu(32, 32))
        self.layer3 = nn.Sequential(conv3x3_bn_relu(32, 64, 2), conv3x3_bn_relu(64, 64))
        self.layer4 = nn.Sequential(conv3x3_bn_relu(64, 64, 1, 2),
                                    nn.Conv2d(64, fc_dim, 1, bias=False),   # bottleneck expansion
                                    nn.BatchNorm2d(fc_dim),
                                    nn.ReLU(inplace=True))

    def forward(self, x, return_feature_maps=False):
        conv_out = []
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = layer(x)
            conv_out.append(x)
        if return_feature_maps:
            return conv_out
        return [x]


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        nn.init.kaiming_normal_(m.weight.data)
    elif classname.find('BatchNorm') != -1:
        m.weight.data.fill_(1.)
        m.bias.data.fill_(1e-4)


class MyPPMDecoder(nn.Module):
    """The self-defined decoder: pyramid pooling + 3x3 conv, no normalisation."""

    def __init__(self, num_class=6, fc_dim=256, pool_scales=(1, 2, 3, 6)):
        super(MyPPMDecoder, self).__init__()
        self.ppm = nn.ModuleList([
            nn.Sequential(nn.AdaptiveAvgPool2d(s), nn.Conv2d(fc_dim, 128, 1), nn.ReLU(inplace=True))
            for s in pool_scales])
        self.conv_last = nn.Sequential(
            nn.Conv2d(fc_dim + len(pool_scales) * 128, 128, 3, padding=1),
            nn.Dropout2d(0.1),
            nn.Conv2d(128, num_class, 1))

    def forward(self, conv_out, segSize=None):
        conv5 = conv_out[-1]
        size = conv5.shape[2:]
        ppm_out = [conv5] + [F.interpolate(m(conv5), size=size, mode='bilinear', align_corners=False)
                             for m in self.ppm]
        x = self.conv_last(torch.cat(ppm_out, 1))
        if segSize is not None:          # inference
            return F.softmax(F.interpolate(x, size=segSize, mode='bilinear', align_corners=False), dim=1)
        return F.log_softmax(x, dim=1)


class SegmentationModule(nn.Module):
    def __init__(self, net_enc, net_dec, crit):
        super(SegmentationModule, self).__init__()
        self.encoder = net_enc
        self.decoder = net_dec
        self.crit = crit

    def pixel_acc(self, pred, label):
        _, preds = torch.max(pred, dim=1)
        valid = (label >= 0).long()
        acc_sum = torch.sum(valid * (preds == label).long())
        pixel_sum = torch.sum(valid)
        return acc_sum.float() / (pixel_sum.float() + 1e-10)

    def forward(self, feed_dict):
        pred = self.decoder(self.encoder(feed_dict['img_data'], return_feature_maps=True))
        loss = self.crit(pred, feed_dict['seg_label'])
        acc = self.pixel_acc(pred, feed_dict['seg_label'])
        return loss, acc


class SyntheticSegDataset(object):
    """Images made of class-coloured 8x8 blocks plus noise; labels at 1/8 resolution."""

    def __init__(self, num_class, imgSize, batch_size, seed=0):
        self.rng = np.random.RandomState(seed)
        self.num_class = num_class
        self.imgSize = imgSize
        self.batch_size = batch_size
        self.palette = self.rng.uniform(-1.5, 1.5, size=(num_class, 3)).astype(np.float32)

    def __iter__(self):
        return self

    def __next__(self):
        s = self.imgSize // 8
        label = self.rng.randint(0, self.num_class, size=(self.batch_size, s, s))
        label[:, :, :s // 2] = self.rng.randint(0, self.num_class, size=(self.batch_size, 1, 1))
        img = self.palette[label].transpose(0, 3, 1, 2)                  # B,3,s,s
        img = np.repeat(np.repeat(img, 8, axis=2), 8, axis=3)
        img = img + 0.3 * self.rng.randn(*img.shape).astype(np.float32)
        label[:, 0, :] = -1                                                # ignored border row
        return {'img_data': torch.from_numpy(img), 'seg_label': torch.from_numpy(label).long()}


# train one epoch
def train(segmentation_module, iterator, optimizers, history, epoch, args):
    batch_time = AverageMeter()
    ave_total_loss = AverageMeter()
    ave_acc = AverageMeter()

    segmentation_module.train()

    tic = time.time()
    for i in range(args.epoch_iters):
        batch_data = next(iterator)
        segmentation_module.zero_grad()

        # forward pass
        loss, acc = segmentation_module(batch_data)
        loss = loss.mean()
        acc = acc.mean()

        # Backward
        loss.backward()
        for optimizer in optimizers:
            optimizer.step()

        # update learning rate
        cur_iter = i + (epoch - 1) * args.epoch_iters
        adjust_learning_rate(optimizers, cur_iter, args)

        batch_time.update(time.time() - tic)
        tic = time.time()

        ave_total_loss.update(loss.data.item())
        ave_acc.update(acc.data.item() * 100)

        if i % args.disp_iter == 0:
            print('Epoch: [{}][{}/{}], Time: {:.2f}, '
                  'lr_encoder: {:.6f}, lr_decoder: {:.6f}, '
                  'Accuracy: {:4.2f}, Loss: {:.6f}'
                  .format(epoch, i, args.epoch_iters, batch_time.average(),
                          args.running_lr_encoder, args.running_lr_decoder,
                          acc.data.item() * 100, loss.data.item()))
            history['train']['epoch'].append(epoch - 1 + 1. * i / args.epoch_iters)
            history['train']['loss'].append(loss.data.item())
            history['train']['acc'].append(acc.data.item())


def group_weight(module):
    group_decay = []
    group_no_decay = []
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)):
            group_decay.append(m.weight)
            if m.bias is not None:
                group_no_decay.append(m.bias)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            if m.weight is not None:
                group_no_decay.append(m.weight)
            if m.bias is not None:
                group_no_decay.append(m.bias)
    assert len(list(module.parameters())) == len(group_decay) + len(group_no_decay)
    return [dict(params=group_decay), dict(params=group_no_decay, weight_decay=.0)]


def create_optimizers(nets, args):
    (net_encoder, net_decoder, crit) = nets
    optimizer_encoder = torch.optim.SGD(
        group_weight(net_encoder), lr=args.lr_encoder,
        momentum=args.beta1, weight_decay=args.weight_decay)
    optimizer_decoder = torch.optim.SGD(
        group_weight(net_decoder), lr=args.lr_decoder,
        momentum=args.beta1, weight_decay=args.weight_decay)
    return (optimizer_encoder, optimizer_decoder)


def adjust_learning_rate(optimizers, cur_iter, args):
    scale_running_lr = ((1. - float(cur_iter) / args.max_iters) ** args.lr_pow)
    args.running_lr_encoder = args.lr_encoder * scale_running_lr
    args.running_lr_decoder = args.lr_decoder * scale_running_lr

    (optimizer_encoder, optimizer_decoder) = optimizers
    for param_group in optimizer_encoder.param_groups:
        param_group['lr'] = args.running_lr_encoder
    for param_group in optimizer_decoder.param_groups:
        param_group['lr'] = args.running_lr_decoder


def main(args):
    net_encoder = DilatedEncoder(fc_dim=args.fc_dim)
    net_encoder.apply(weights_init)
    net_decoder = MyPPMDecoder(num_class=args.num_class, fc_dim=args.fc_dim)
    net_decoder.apply(weights_init)
    crit = nn.NLLLoss(ignore_index=-1)
    segmentation_module = SegmentationModule(net_encoder, net_decoder, crit)

    iterator_train = iter(SyntheticSegDataset(args.num_class, args.imgSize, args.batch_size_per_gpu, args.seed))
    print('1 Epoch = {} iters'.format(args.epoch_iters))

    nets = (net_encoder, net_decoder, crit)
    optimizers = create_optimizers(nets, args)

    history = {'train': {'epoch': [], 'loss': [], 'acc': []}}
    for epoch in range(args.start_epoch, args.num_epoch + 1):
        train(segmentation_module, iterator_train, optimizers, history, epoch, args)
    print('Training Done!')


if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    # Model related arguments
    parser.add_argument('--id', default='baseline', help="a name for identifying the model")
    parser.add_argument('--arch_encoder', default='resnet50_dilated8', help="architecture of net_encoder")
    parser.add_argument('--arch_decoder', default='my_ppm', help="architecture of net_decoder")
    parser.add_argument('--fc_dim', default=256, type=int, help='number of features between encoder and decoder')
    # Data related arguments
    parser.add_argument('--num_class', default=6, type=int, help='number of classes')
    parser.add_argument('--imgSize', default=48, type=int, help='input image size')
    parser.add_argument('--batch_size_per_gpu', default=4, type=int, help='input batch size')
    # Optimization related arguments
    parser.add_argument('--num_epoch', default=2, type=int, help='epochs to train for')
    parser.add_argument('--start_epoch', default=1, type=int, help='epoch to start training')
    parser.add_argument('--epoch_iters', default=15, type=int, help='iterations of each epoch')
    parser.add_argument('--optim', default='SGD', help='optimizer')
    parser.add_argument('--lr_encoder', default=2e-2, type=float, help='LR')
    parser.add_argument('--lr_decoder', default=2e-1, type=float, help='LR (x10: decoder is trained from scratch)')
    parser.add_argument('--lr_pow', default=0.9, type=float, help='power in poly to drop LR')
    parser.add_argument('--beta1', default=0.9, type=float, help='momentum for sgd, beta1 for adam')
    parser.add_argument('--weight_decay', default=1e-4, type=float, help='weights regularizer')
    parser.add_argument('--seed', default=304, type=int, help='manual seed')
    parser.add_argument('--disp_iter', type=int, default=2, help='frequency to display')
    args = parser.parse_args()

    args.max_iters = args.epoch_iters * args.num_epoch
    args.running_lr_encoder = args.lr_encoder
    args.running_lr_decoder = args.lr_decoder

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    main(args)
