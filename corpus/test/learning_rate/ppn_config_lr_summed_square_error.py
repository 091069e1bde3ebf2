"""Pose Proposal Networks (wangziren1/pytorch_pose_proposal_networks): loss turns nan with LR = 0.001.

Reproduces https://github.com/wangziren1/pytorch_pose_proposal_networks/issues/4 ("the train loss
is nan ... no matter use the resnet18 or using the resnet50"; a second user: "this problem will
occur while i use loss_coor in final loss").  The project keeps its hyper-parameters as
module-level constants in ``src/config.py`` (``BATCH_SIZE = 1``, ``LR = 0.001``,
``MOMENTUM = 0.9``, ``WEIGHT_DECAY = 0.0005``) and trains with plain SGD.  The PPN head ends
in two un-normalised 3x3 convs (LeakyReLU, no BN on the second) and a 1x1 conv, and every loss
term is a *summed* squared error over the whole 12x12 grid and all 1311 output channels
(``square_error = 1 / N * sum(mask * (output - target) ** 2)``), so the curvature the optimizer
sees is large and scales with the number of masked cells.  At LR = 0.001 with momentum 0.9 the
SGD iteration on these quadratic terms is unstable: the coordinate/size/limb outputs oscillate
with growing amplitude, the squared errors grow by orders of magnitude per step (loss about 1e2,
then 1e3, 1e6, 1e20 within eight single-image steps) until the outputs and their squares
overflow (``get_iou`` squares them too, ``w_p = output ** 2 * IMG_SIZE``), the gradients and
then the weights become nan, and every loss prints nan.

Fix (maintainer wangziren1: "Maybe, dropping learning rate by ten times or five times helps"):
``LR = 0.0001`` in the config.

Written like the project: constants at the top (``src/config.py``), ``which_model(IS_SHALLOW)``
building a ResNet-18 whose ``fc`` is replaced by the PPN conv head and whose output is permuted
to (N, H, W, C), the training loop of ``src/train.py`` (``get_iou`` writes the IoU targets,
``square_error`` per output slice ``[..., k:96:6]``, poly learning-rate decay set by hand on
``optimizer.param_groups[0]['lr']``, an ``AverageMeter(num=6)`` and the
``epoch:..., step:..., lr:... resp_loss:... loss:...`` print).  Synthetic MPI-like data:
random images with 16 joints of one person drawn as blobs, targets built the way ``mpi.py``
builds them.  The backbone is a narrow ResNet-18 trained from scratch on 256x256 inputs (8x8
cells, a 5x5 limb grid instead of 9x9) so that it runs on a CPU; the PPN head keeps the
project's 512 channels.
"""
import math
import random

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

# ------------------------------------------------------------------ src/config.py
IS_SHALLOW = True

BATCH_SIZE = 1
NUM_WORKS = 0
MAX_EPOCH = 2
LR = 0.001
MOMENTUM = 0.9
WEIGHT_DECAY = 0.0005

IMG_SIZE = 256
CELL_SIZE = 32
CELL_NUM = 8
NUM_JOINTS = 16
LIMB_GRID = 5          # local displacement grid of the limb output (9 in the paper)
NUM_LIMBS = 15

# Loss weights
scale_resp = 0.25
scale_iou = 1
scale_coor = 5
scale_size = 5
scale_limb = 0.5

NUM_TRAIN = 60
SEED = 0

# ------------------------------------------------------------------ src/utils.py
limbs_start = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
limbs_end = [0, 0, 2, 3, 4, 2, 6, 7, 15, 9, 10, 15, 12, 13, 2]
device = torch.device('cpu')
y, x = torch.meshgrid(torch.arange(CELL_NUM, dtype=torch.float, device=device),
                      torch.arange(CELL_NUM, dtype=torch.float, device=device), indexing='ij')
x_offset = x.unsqueeze(2).repeat(1, 1, NUM_JOINTS)
y_offset = y.unsqueeze(2).repeat(1, 1, NUM_JOINTS)
OUT_CHANNELS = 6 * NUM_JOINTS + LIMB_GRID * LIMB_GRID * NUM_LIMBS


# ------------------------------------------------------------------ src/dataset/mpi.py
class MPI(torch.utils.data.Dataset):
    """One synthetic person per image: 16 joints around a centre, drawn as bright blobs."""

    def __init__(self, num, is_train=True):
        rng = np.random.RandomState(SEED)
        self.samples = []
        half = LIMB_GRID // 2
        for _ in range(num):
            img = rng.rand(IMG_SIZE, IMG_SIZE, 3) * 0.4
            centre = rng.uniform(48, IMG_SIZE - 48, size=2)
            joints = centre + rng.uniform(-44, 44, size=(NUM_JOINTS, 2))
            joints = np.clip(joints, 2, IMG_SIZE - 3)
            for j, (jx, jy) in enumerate(joints):
                x0, y0 = int(jx), int(jy)
                img[max(0, y0 - 2):y0 + 3, max(0, x0 - 2):x0 + 3] = (j % 4) / 4 + 0.25
            img = (img - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
            label = np.zeros((CELL_NUM, CELL_NUM, OUT_CHANNELS))
            mask = np.zeros((CELL_NUM, CELL_NUM, OUT_CHANNELS))
            mask[:, :, 0:6 * NUM_JOINTS:6] = 1
            head_length = np.linalg.norm(joints[1] - joints[2]) + 4.0
            cells = (joints / CELL_SIZE).astype(int)
            for i in range(NUM_JOINTS):
                gx, gy = cells[i]
                offset = i * 6
                label[gy, gx, offset] = 1
                label[gy, gx, offset + 2:offset + 4] = joints[i]
                label[gy, gx, offset + 4:offset + 6] = 2 * head_length if i == 0 else 0.5 * head_length
                mask[gy, gx, offset + 1:offset + 6] = 1
            for k, (s, e) in enumerate(zip(limbs_start, limbs_end)):
                sx, sy = cells[s]
                dx, dy = cells[e] - cells[s]
                base = 6 * NUM_JOINTS + k * LIMB_GRID * LIMB_GRID
                mask[sy, sx, base:base + LIMB_GRID * LIMB_GRID] = 1
                if abs(dx) <= half and abs(dy) <= half:
                    label[sy, sx, base + (dy + half) * LIMB_GRID + (dx + half)] = 1
            self.samples.append((torch.from_numpy(img.transpose(2, 0, 1).astype(np.float32)),
                                 torch.from_numpy(label.astype(np.float32)),
                                 torch.from_numpy(mask.astype(np.float32))))

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, idx):
        return self.samples[idx]


# ------------------------------------------------------------------ src/model/model.py
def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super(BasicBlock, self).__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        residual = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            residual = self.downsample(x)
        return self.relu(out + residual)


class ResNet(nn.Module):
    def __init__(self, block, layers, width=16):
        self.inplanes = width
        super(ResNet, self).__init__()
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.fc = nn.Identity()
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                m.weight.data.normal_(0, math.sqrt(2. / n))
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * block.expansion, kernel_size=1, stride=stride,
                          bias=False),
                nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.fc(x)
        return x.permute(0, 2, 3, 1)


def resnet18(net_state_dict=None):
    model = ResNet(BasicBlock, [2, 2, 2, 2])
    print('No pretrain weight here: training resnet18 from scratch...')
    model.fc = nn.Sequential(nn.Conv2d(128, 512, kernel_size=3, stride=1, padding=1),
                             nn.BatchNorm2d(512),
                             nn.LeakyReLU(negative_slope=0.1),
                             nn.Conv2d(512, 512, kernel_size=3, stride=1, padding=1),
                             nn.LeakyReLU(negative_slope=0.1),
                             nn.Conv2d(512, OUT_CHANNELS, kernel_size=1, stride=1, padding=0))
    return model


def which_model(is_shallow, net_state_dict=None):
    assert is_shallow, 'only the resnet18 variant is reproduced here'
    return resnet18(net_state_dict)


# ------------------------------------------------------------------ src/train.py
class AverageMeter:
    """Computes and stores the average and current value"""

    def __init__(self, num):
        self.avg = np.zeros(num)
        self.sum = np.zeros(num)
        self.count = 0

    def reset(self):
        self.avg[:] = 0
        self.sum[:] = 0
        self.count = 0

    def update(self, *val, n=1):
        self.sum += np.array(val) * n
        self.count += n
        self.avg = self.sum / self.count


def get_iou(output, target, mask):
    output, target, mask = output[:, :, :, :96].clone(), target[:, :, :, :96].clone(), \
        mask[:, :, :, :96].clone()
    output[:, :, :, 2::6] += x_offset
    output[:, :, :, 3::6] += y_offset
    mask[:, :, :, 0::6] = 0
    mask[:, :, :, 1::6] = 0
    mask = mask.bool()

    ox_p = output[mask][0::4] * CELL_SIZE
    oy_p = output[mask][1::4] * CELL_SIZE
    w_p = output[mask][2::4].pow(2) * IMG_SIZE
    h_p = output[mask][3::4].pow(2) * IMG_SIZE

    ox_gt = target[mask][0::4]
    oy_gt = target[mask][1::4]
    w_gt = target[mask][2::4]
    h_gt = target[mask][3::4]

    tl_x = torch.max(ox_p - 0.5 * w_p, ox_gt - 0.5 * w_gt)
    tl_y = torch.max(oy_p - 0.5 * h_p, oy_gt - 0.5 * h_gt)
    br_x = torch.min(ox_p + 0.5 * w_p, ox_gt + 0.5 * w_gt)
    br_y = torch.min(oy_p + 0.5 * h_p, oy_gt + 0.5 * h_gt)

    delta_x, delta_y = br_x - tl_x, br_y - tl_y
    condition = (delta_x < 0) | (delta_y < 0)
    intersection = torch.where(condition, torch.zeros_like(delta_x), delta_x * delta_y)
    union = torch.max(w_p * h_p + w_gt * h_gt - intersection, torch.full_like(delta_x, 1e-10))
    iou = intersection / union
    iou = torch.clamp(iou, 0, 1)
    return iou


def square_error(output, target, mask):
    return 1 / output.shape[0] * torch.sum(mask * (output - target).pow(2))


def main():
    random.seed(SEED)
    np.random.seed(SEED)
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    train_dset = MPI(NUM_TRAIN, is_train=True)
    g = torch.Generator()
    g.manual_seed(SEED)
    train_loader = torch.utils.data.DataLoader(train_dset, batch_size=BATCH_SIZE, shuffle=True,
                                               num_workers=NUM_WORKS, generator=g)
    net = which_model(IS_SHALLOW)
    net.to(device)
    optimizer = optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)

    net.train()
    step = -1
    loss_recorder = AverageMeter(num=6)
    for epoch in range(0, MAX_EPOCH):
        loss_recorder.reset()
        for i, (input, target, mask) in enumerate(train_loader, 1):
            input = input.to(device)
            target, mask = target.to(device), mask.to(device)
            output = net(input)
            output_detach = output.detach()

            iou = get_iou(output_detach, target, mask)
            mask_iou = torch.zeros_like(mask)
            mask_iou[:, :, :, 1:96:6] = mask[:, :, :, 1:96:6]
            mask_iou = mask_iou.bool()
            target[mask_iou] = iou

            output_resp = output[:, :, :, 0:96:6]
            output_iou = output[:, :, :, 1:96:6]
            output_coor_x, output_coor_y = output[:, :, :, 2:96:6], output[:, :, :, 3:96:6]
            output_w, output_h = output[:, :, :, 4:96:6], output[:, :, :, 5:96:6]
            output_limb = output[:, :, :, 96:]

            target_resp = target[:, :, :, 0:96:6]
            target_iou = target[:, :, :, 1:96:6]
            target_coor_x = target[:, :, :, 2:96:6] / CELL_SIZE - x_offset
            target_coor_y = target[:, :, :, 3:96:6] / CELL_SIZE - y_offset
            target_w = torch.sqrt(target[:, :, :, 4:96:6] / IMG_SIZE)
            target_h = torch.sqrt(target[:, :, :, 5:96:6] / IMG_SIZE)
            target_limb = target[:, :, :, 96:]

            mask_resp = mask[:, :, :, 0:96:6]
            mask_joint = mask[:, :, :, 1:96:6]
            mask_limb = mask[:, :, :, 96:]

            loss_resp = scale_resp * square_error(output_resp, target_resp, mask_resp)
            loss_iou = scale_iou * square_error(output_iou, target_iou, mask_joint)
            loss_coor = scale_coor * (square_error(output_coor_x, target_coor_x, mask_joint) +
                                      square_error(output_coor_y, target_coor_y, mask_joint))
            loss_size = scale_size * (square_error(output_w, target_w, mask_joint) +
                                      square_error(output_h, target_h, mask_joint))
            loss_limb = scale_limb * square_error(output_limb, target_limb, mask_limb)
            loss = loss_resp + loss_iou + loss_coor + loss_size + loss_limb
            loss_recorder.update(loss_resp.item(), loss_iou.item(), loss_coor.item(),
                                 loss_size.item(), loss_limb.item(), loss.item(),
                                 n=output.shape[0])

            # Modify learning rate
            step += 1
            lr = LR * (1 - step / (MAX_EPOCH * len(train_loader)))
            optimizer.param_groups[0]['lr'] = lr

            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            if i % 4 == 0:
                print('epoch:{}, step:{}, lr:{:.6f} resp_loss:{:.2f}, iou_loss:{:.3f}, coor_loss:{:.2f}, '
                      'size_loss:{:.3f}, limb_loss:{:.2f}, loss:{:.2f}'.format(
                          epoch, i, lr, *loss_recorder.avg), flush=True)
        print()


if __name__ == '__main__':
    main()
