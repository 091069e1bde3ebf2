"""Train a PifPaf human-pose network: scaled-down openpifpaf training stack of mid 2019.

Setting: openpifpaf.train / optimize / network.{losses,trainer} in one file.  ResNet-like base
net with frozen BatchNorm (fix_batch_norm), 1x1 expansion, pif and paf CompositeField heads,
Laplace regression loss, MultiHeadLoss lambdas 30 2 2 50 3 3, one frozen-base epoch
(--freeze-base 1), then SGD (Nesterov, momentum 0.95) with openpifpaf's epoch-wise LambdaLR
burn-in lr * 0.01 ** (1 - epoch / burn_in_epochs).  Synthetic 49x49 scenes with one or two
seven-keypoint persons, batch size 32: only 8 optimizer steps per epoch.

Bug (https://github.com/openpifpaf/openpifpaf/issues/112): `--lr=1e-3 --momentum=0.95
--batch-size=32` on 4 GPUs gives nan losses.  The burn-in is counted in epochs (default 3); with
the large batch an epoch has few steps, so the rate jumps x4.6 at each epoch boundary and is at
full strength before the net has settled.  Here (base rate 3e-3 for this small net) the loss is
54.7 / 47.9 / 35.6 / 16.8 over the frozen-base epoch and the burn-in, then the first epoch at the
full rate blows the heads up and every later loss prints nan.

Fix (maintainer): "your learning rate schedule is too aggressive for that batch size.  Try
increasing the burn-in epochs to 12" (same number of burn-in steps; PR #132 later stepped the
schedule per batch).  With --lr-burn-in-epochs 12 the run trains 18 epochs without nan, 54.7 -> 0.66.
"""
import argparse
import logging

import numpy as np
import torch

KEYPOINTS = ['nose', 'left_shoulder', 'right_shoulder', 'left_hip', 'right_hip', 'left_knee', 'right_knee']
SKELETON = [(1, 2), (1, 3), (2, 4), (3, 5), (4, 6), (5, 7), (2, 3), (4, 5)]  # 1-based, like COCO_PERSON_SKELETON
TEMPLATE = np.array([[0, -1], [-.35, -.6], [.35, -.6], [-.25, .1], [.25, .1], [-.3, .8], [.3, .8]], np.float32)


def cli():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    group = parser.add_argument_group('optimizer and learning rate scheduler')
    group.add_argument('--momentum', type=float, default=0.95, help='SGD momentum')
    group.add_argument('--lr', type=float, default=3e-3, help='learning rate')
    group.add_argument('--lr-decay', default=[60, 70], nargs='+', type=int)
    group.add_argument('--lr-burn-in-epochs', default=3, type=int, help='epochs with lower learning rate')
    group.add_argument('--lr-burn-in-factor', default=0.01, type=float, help='pre-factor during burn-in')
    parser.add_argument('--lambdas', default=[30.0, 2.0, 2.0, 50.0, 3.0, 3.0], type=float, nargs='+')
    parser.add_argument('--epochs', default=18, type=int)
    parser.add_argument('--freeze-base', default=1, type=int, help='epochs to train with frozen base')
    parser.add_argument('--pre-lr', type=float, default=1e-4, help='pre learning rate')
    parser.add_argument('--batch-size', default=32, type=int)
    parser.add_argument('--seed', default=3, type=int)
    return parser.parse_args()


class PoseScenes(torch.utils.data.Dataset):
    def __init__(self, n_images, square_edge, stride, rng):
        self.square_edge, self.stride = square_edge, stride
        self.images, self.anns = [], []
        yy, xx = np.mgrid[0:square_edge, 0:square_edge].astype(np.float32)
        for _ in range(n_images):
            img = rng.normal(0.0, 0.5, size=(3, square_edge, square_edge)).astype(np.float32)
            anns = []
            for _ in range(rng.integers(1, 3)):
                size = rng.uniform(8, 16)
                center = rng.uniform(size + 4, square_edge - size - 4, size=2)
                kps = center + size * TEMPLATE + rng.normal(0, 1.5, size=TEMPLATE.shape)
                for k, (x, y) in enumerate(kps):
                    img[k % 3] += np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / 8.0) * (1.0 + 0.3 * k)
                anns.append(np.concatenate([kps, np.full((len(kps), 1), 2.0)], axis=1))
            self.images.append(img)
            self.anns.append(anns)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        n = (self.square_edge - 1) // self.stride + 1
        kps_sets = [ann[:, :2] / self.stride for ann in self.anns[index]]
        return torch.from_numpy(self.images[index]), [pif_encode(kps_sets, n), paf_encode(kps_sets, n)]


def pif_encode(kps_sets, n, side_length=4):
    intensities = np.zeros((len(KEYPOINTS) + 1, n, n), dtype=np.float32)
    intensities[-1] = 1.0
    fields_reg = np.zeros((len(KEYPOINTS), 2, n, n), dtype=np.float32)
    fields_scale = np.zeros((len(KEYPOINTS), n, n), dtype=np.float32)
    s_offset = (side_length - 1.0) / 2.0
    for kps in kps_sets:
        scale = np.sqrt(np.prod(kps.max(axis=0) - kps.min(axis=0)))
        for f, xy in enumerate(kps):
            ij = np.round(xy - s_offset).astype(int)
            minx, miny = max(ij[0], 0), max(ij[1], 0)
            maxx, maxy = min(ij[0] + side_length, n), min(ij[1] + side_length, n)
            cx, cy = np.meshgrid(np.arange(minx, maxx), np.arange(miny, maxy))
            intensities[f, miny:maxy, minx:maxx] = 1.0
            intensities[-1, max(miny - 1, 0):maxy + 1, max(minx - 1, 0):maxx + 1] = 0.0
            fields_reg[f, 0, miny:maxy, minx:maxx] = xy[0] - cx
            fields_reg[f, 1, miny:maxy, minx:maxx] = xy[1] - cy
            fields_scale[f, miny:maxy, minx:maxx] = scale
    return [torch.from_numpy(a) for a in (intensities, fields_reg, fields_scale)]


def paf_encode(kps_sets, n):
    intensities = np.zeros((len(SKELETON) + 1, n, n), dtype=np.float32)
    intensities[-1] = 1.0
    fields_reg1 = np.zeros((len(SKELETON), 2, n, n), dtype=np.float32)
    fields_reg2 = np.zeros((len(SKELETON), 2, n, n), dtype=np.float32)
    for kps in kps_sets:
        for s, (j1, j2) in enumerate(SKELETON):
            a, b = kps[j1 - 1], kps[j2 - 1]
            for t in np.linspace(0.0, 1.0, 6):
                x, y = np.round(a + t * (b - a)).astype(int)
                if 0 <= x < n and 0 <= y < n:
                    intensities[s, y, x] = 1.0
                    intensities[-1, max(y - 1, 0):y + 2, max(x - 1, 0):x + 2] = 0.0
                    fields_reg1[s, :, y, x] = a - (x, y)
                    fields_reg2[s, :, y, x] = b - (x, y)
    return [torch.from_numpy(a) for a in (intensities, fields_reg1, fields_reg2)] + [None]


def collate_images_targets(batch):
    targets = [[torch.stack([b[1][h][i] for b in batch]) if batch[0][1][h][i] is not None else None
                for i in range(len(batch[0][1][h]))] for h in range(len(batch[0][1]))]
    return torch.stack([b[0] for b in batch]), targets


class BasicBlock(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)
        self.conv2, self.bn2 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False), torch.nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class BaseNet(torch.nn.Module):
    stride = 8

    def __init__(self, width=32, n_blocks=8, out_features=512):
        super().__init__()
        layers, c_in = [], 3
        for c in (16, 32, width):
            layers += [torch.nn.Conv2d(c_in, c, 3, stride=2, padding=1, bias=False),
                       torch.nn.BatchNorm2d(c), torch.nn.ReLU(inplace=True)]
            c_in = c
        self.net = torch.nn.Sequential(*layers, *[BasicBlock(width) for _ in range(n_blocks)],
                                       torch.nn.Conv2d(width, out_features, 1, bias=False),
                                       torch.nn.BatchNorm2d(out_features), torch.nn.ReLU(inplace=True))
        self.out_features = out_features
        for m in self.modules():
            if isinstance(m, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')

    def forward(self, x):
        return self.net(x)


class CompositeField(torch.nn.Module):
    def __init__(self, head_name, in_features, n_fields, n_vectors, n_scales):
        super().__init__()
        conv = lambda n_out: torch.nn.Conv2d(in_features, n_out, 1)  # noqa: E731
        self.class_convs = torch.nn.ModuleList([conv(n_fields)])
        self.reg_convs = torch.nn.ModuleList([conv(2 * n_fields) for _ in range(n_vectors)])
        self.reg_spreads = torch.nn.ModuleList([conv(n_fields) for _ in self.reg_convs])
        self.scale_convs = torch.nn.ModuleList([conv(n_fields) for _ in range(n_scales)])

    def forward(self, x):
        classes_x = [class_conv(x) for class_conv in self.class_convs]
        regs_x = [reg_conv(x) for reg_conv in self.reg_convs]
        regs_x_spread = [torch.nn.functional.leaky_relu(reg_spread(x) + 2.0) - 2.0
                         for reg_spread in self.reg_spreads]
        scales_x = [torch.nn.functional.relu(scale_conv(x)) for scale_conv in self.scale_convs]
        regs_x = [r.reshape(r.shape[0], r.shape[1] // 2, 2, r.shape[2], r.shape[3]) for r in regs_x]
        return classes_x + regs_x + regs_x_spread + scales_x


class Shell(torch.nn.Module):
    def __init__(self, base_net, head_nets):
        super().__init__()
        self.base_net, self.head_nets = base_net, torch.nn.ModuleList(head_nets)

    def forward(self, image_batch):
        x = self.base_net(image_batch)
        return [hn(x) for hn in self.head_nets]


def laplace_loss(x1, x2, logb, t1, t2):
    norm = torch.sqrt((x1 - t1)**2 + (x2 - t2)**2)
    return torch.sum(0.694 + logb + norm * torch.exp(-logb))


class CompositeLoss(torch.nn.Module):
    def __init__(self, head_name, n_vectors, n_scales):
        super().__init__()
        self.n_vectors = n_vectors
        self.field_names = ([head_name + '.c'] + [f'{head_name}.vec{i + 1}' for i in range(n_vectors)]
                            + [f'{head_name}.scales{i + 1}' for i in range(n_scales)])

    def forward(self, x, t):
        x_intensity, x_regs = x[0], x[1:1 + self.n_vectors]
        x_spreads, x_scales = x[1 + self.n_vectors:1 + 2 * self.n_vectors], x[1 + 2 * self.n_vectors:]
        target_intensity, target_regs, target_scale = t[0], t[1:1 + self.n_vectors], t[-1]
        batch_size = x_intensity.shape[0]
        bce_masks = (target_intensity[:, :-1] + target_intensity[:, -1:]) > 0.5
        ce_loss = torch.nn.functional.binary_cross_entropy_with_logits(
            torch.masked_select(x_intensity, bce_masks),
            torch.masked_select(target_intensity[:, :-1], bce_masks))
        reg_masks = target_intensity[:, :-1] > 0.5
        sel = lambda f: torch.masked_select(f, reg_masks)  # noqa: E731
        reg_losses = [laplace_loss(sel(x_reg[:, :, 0]), sel(x_reg[:, :, 1]), sel(x_spread),
                                   sel(target_reg[:, :, 0]), sel(target_reg[:, :, 1])) / 1000.0 / batch_size
                      for x_reg, x_spread, target_reg in zip(x_regs, x_spreads, target_regs)]
        scale_losses = [torch.nn.functional.l1_loss(sel(x_scale), sel(target_scale), reduction='sum')
                        / 1000.0 / batch_size for x_scale in x_scales]
        return [ce_loss] + reg_losses + scale_losses


class MultiHeadLoss(torch.nn.Module):
    def __init__(self, losses, lambdas):
        super().__init__()
        self.losses, self.lambdas = torch.nn.ModuleList(losses), lambdas
        self.field_names = [n for l in self.losses for n in l.field_names]

    def forward(self, head_fields, head_targets):
        flat_head_losses = [ll for l, f, t in zip(self.losses, head_fields, head_targets) for ll in l(f, t)]
        return sum(lam * l for lam, l in zip(self.lambdas, flat_head_losses)), flat_head_losses


def optimizer_factory(args, parameters):
    optimizer = torch.optim.SGD((p for p in parameters if p.requires_grad), lr=args.lr,
                                momentum=args.momentum, weight_decay=0.0, nesterov=True)
    def lambda_schedule(epoch):
        if epoch < args.lr_burn_in_epochs:
            return args.lr_burn_in_factor**(1.0 - epoch / args.lr_burn_in_epochs)
        return 0.1 ** sum(epoch >= d for d in args.lr_decay)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, [lambda_schedule])


class Trainer(object):
    def __init__(self, model, loss, optimizer, *, lr_scheduler=None, fix_batch_norm=True):
        self.log = logging.getLogger(self.__class__.__name__)
        self.model, self.loss, self.optimizer = model, loss, optimizer
        self.lr_scheduler, self.fix_batch_norm = lr_scheduler, fix_batch_norm

    def train_batch(self, data, targets):
        loss, head_losses = self.loss(self.model(data), targets)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return float(loss.item()), [float(l.item()) for l in head_losses]

    def train(self, scenes, epoch):
        self.model.train()
        if self.fix_batch_norm:
            for m in self.model.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.eval()
        epoch_loss, head_epoch_losses = 0.0, [0.0 for _ in self.loss.field_names]
        self.optimizer.zero_grad()
        lr = self.optimizer.param_groups[0]['lr']
        for data, target in scenes:
            loss, head_losses = self.train_batch(data, target)
            epoch_loss += loss
            head_epoch_losses = [a + b for a, b in zip(head_epoch_losses, head_losses)]
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.log.info({'type': 'train-epoch', 'epoch': epoch + 1, 'lr': round(lr, 6),
                       'loss': round(epoch_loss / len(scenes), 5),
                       'head_losses': [round(l / len(scenes), 5) for l in head_epoch_losses]})


def main():
    args = cli()
    logging.basicConfig(level=logging.INFO, format='%(message)s')
    torch.manual_seed(args.seed)
    base_net = BaseNet()
    net = Shell(base_net, [CompositeField('pif', base_net.out_features, len(KEYPOINTS), n_vectors=1, n_scales=1),
                           CompositeField('paf', base_net.out_features, len(SKELETON), n_vectors=2, n_scales=0)])
    loss = MultiHeadLoss([CompositeLoss('pif', 1, 1), CompositeLoss('paf', 2, 0)], args.lambdas)
    train_loader = torch.utils.data.DataLoader(
        PoseScenes(256, 49, BaseNet.stride, np.random.default_rng(args.seed)), batch_size=args.batch_size,
        shuffle=True, drop_last=True, collate_fn=collate_images_targets,
        generator=torch.Generator().manual_seed(args.seed))

    if args.freeze_base:
        frozen_params = [p for n, p in net.named_parameters() if n.startswith('base_net.')]
        for p in frozen_params:
            p.requires_grad = False
        foptimizer = torch.optim.SGD((p for p in net.parameters() if p.requires_grad),
                                     lr=args.pre_lr, momentum=0.9, weight_decay=0.0, nesterov=True)
        for i in range(-args.freeze_base, 0):
            Trainer(net, loss, foptimizer).train(train_loader, i)
        for p in frozen_params:
            p.requires_grad = True

    optimizer, lr_scheduler = optimizer_factory(args, net.parameters())
    trainer = Trainer(net, loss, optimizer, lr_scheduler=lr_scheduler)
    for epoch in range(args.epochs):
        trainer.train(train_loader, epoch)


if __name__ == '__main__':
    main()
