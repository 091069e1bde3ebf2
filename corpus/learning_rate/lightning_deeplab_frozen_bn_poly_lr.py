"""DCSP-style segmentation training (DeepLab-ResNet with frozen BatchNorm), ported to Lightning.

The network has a segmentation ASPP head (fc1_voc12_c0..c3, 10x / 20x learning rate for
weights / biases) and an image-level classification head on global average pooling, trained
with momentum SGD, a "poly" learning-rate decay and weight decay, as in train_segmentation.py.
BatchNorm statistics stay frozen (small batches), so the residual backbone is un-normalised
once its weights move.

Bug: LEARNING_RATE = 1e-3 is too large for this setup: the first SGD steps push the
backbone away from the frozen BN statistics and the activations grow from block to block;
the loss goes 3.0, 10.5, 8.6, 14, 182, 4.1e5 over steps 0-5 and is nan from step 6 on
(first printed as "step 10 loss = nan"), and every later step is nan.
Report: https://github.com/arslan-chaudhry/dcsp_segmentation/issues/1 ("I started with 1e-3
and then after 14 steps the loss became nan. Now I am using lr = 5e-4 and the loss is going
down smoothly"; maintainer: "Yes, we lowered the learning rate while training the
segmentation network. 5e-4 should work fine.").
Fix: LEARNING_RATE = 5e-4 trains without nan (loss 3.0 -> ~1.1-1.3, foreground pixel
accuracy ~0.25-0.6 after 150 steps).
"""
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

NUM_CLASSES = 5
BATCH_SIZE = 8
INPUT_SIZE = 40
LEARNING_RATE = 1e-3
MOMENTUM = 0.9
NUM_STEPS = 150
POWER = 0.9
WEIGHT_DECAY = 0.0005
RANDOM_SEED = 1234
INIT_STD = 0.015
IMG_MEAN = torch.tensor([104.00698793, 116.66876762, 122.67891434]).view(3, 1, 1)
COLOURS = torch.tensor([[20, 20, 20], [200, 40, 40], [40, 200, 40], [40, 40, 200], [220, 220, 60]],
                       dtype=torch.float)


class ShapesVOC(Dataset):
    """VOC-like scenes: 1-3 coloured blobs on a random background, pixel labels + image tags."""

    def __init__(self, n_images=400, size=INPUT_SIZE, seed=0):
        g = torch.Generator().manual_seed(seed)
        yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        self.images, self.labels = [], []
        for _ in range(n_images):
            bg = torch.rand(3, generator=g) * 255
            img = bg.view(3, 1, 1).expand(3, size, size).clone()
            lab = torch.zeros(size, size, dtype=torch.long)
            for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
                c = int(torch.randint(1, NUM_CLASSES, (1,), generator=g))
                cy, cx = (torch.rand(2, generator=g) * size).tolist()
                r = size * (0.12 + 0.2 * float(torch.rand(1, generator=g)))
                blob = ((yy - cy) ** 2 + (xx - cx) ** 2) < r * r
                img[:, blob] = COLOURS[c].view(3, 1) + torch.randn(3, 1, generator=g) * 20
                lab[blob] = c
            img = img + torch.randn(3, size, size, generator=g) * 10
            self.images.append(img.clamp(0, 255))
            self.labels.append(lab)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i] - IMG_MEAN          # caffe-style: mean subtraction only
        label = self.labels[i]
        catg = torch.stack([(label == c).any() for c in range(1, NUM_CLASSES)]).float()
        return image, label, catg


class Bottleneck(nn.Module):
    def __init__(self, cin, mid, cout, dilation=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.conv2 = nn.Conv2d(mid, mid, 3, padding=dilation, dilation=dilation, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.downsample = None
        if cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class DeepLabResNetModel(nn.Module):
    def __init__(self, n_classes=NUM_CLASSES):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1))
        self.res = nn.Sequential(
            Bottleneck(32, 32, 256),
            *[Bottleneck(256, 32, 256, dilation=2) for _ in range(3)],
            Bottleneck(256, 64, 512, dilation=2))
        self.fc1_voc12 = nn.ModuleList(
            [nn.Conv2d(512, n_classes, 3, padding=d, dilation=d) for d in (1, 2, 3, 4)])
        self.fc1_voc12_d0 = nn.Conv2d(512, n_classes - 1, 1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, std=INIT_STD)
        for m in list(self.fc1_voc12) + [self.fc1_voc12_d0]:
            nn.init.normal_(m.weight, std=0.01)
            nn.init.zeros_(m.bias)

    def forward(self, x):
        feat = self.res(self.stem(x))
        seg = sum(branch(feat) for branch in self.fc1_voc12)
        catg = self.fc1_voc12_d0(feat).mean(dim=(2, 3))     # global average pooling
        return seg, catg

    def train(self, mode=True):
        # keep the BN statistics (and the BN scale / offset) frozen, as with is_training=False
        super().train(mode)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
        return self


@torch.no_grad()
def restore_bn_statistics(net, loader, n_batches=10):
    """No ImageNet checkpoint offline: estimate the frozen BN statistics once, then freeze."""
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
            m.training = True
    for i, (images, _, _) in enumerate(loader):
        if i == n_batches:
            break
        net(images)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.training = False
            m.weight.requires_grad_(False)
            m.bias.requires_grad_(False)


class DCSPSegmentation(L.LightningModule):
    def __init__(self, net, base_learning_rate=LEARNING_RATE):
        super().__init__()
        self.net = net
        self.base_learning_rate = base_learning_rate

    def training_step(self, batch, batch_idx):
        images, labels, catg = batch
        raw_output_seg, raw_output_classfc = self.net(images)
        label_proc = F.interpolate(labels[:, None].float(), size=raw_output_seg.shape[2:],
                                   mode="nearest")[:, 0].long()
        seg_loss = F.cross_entropy(raw_output_seg, label_proc)
        classfc_loss = F.binary_cross_entropy_with_logits(raw_output_classfc, catg)
        loss = seg_loss + classfc_loss
        step = self.global_step
        if step % 5 == 0:
            with torch.no_grad():
                pred = raw_output_seg.argmax(1)
                fg = label_proc > 0
                fg_acc = (pred[fg] == label_proc[fg]).float().mean().item()
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            print("step {:d} \t loss = {:.3f} seg = {:.3f} fg_acc = {:.3f} lr = {:.5f}".format(
                step, loss.item(), seg_loss.item(), fg_acc, lr))
        return loss

    def configure_optimizers(self):
        head = list(self.net.fc1_voc12.parameters()) + list(self.net.fc1_voc12_d0.parameters())
        head_ids = {id(p) for p in head}
        conv_trainable = [p for p in self.net.parameters()
                          if p.requires_grad and id(p) not in head_ids]
        fc_w = [p for p in head if p.dim() > 1]
        fc_b = [p for p in head if p.dim() == 1]
        lr = self.base_learning_rate
        optimizer = torch.optim.SGD(
            [{"params": conv_trainable, "lr": lr},
             {"params": fc_w, "lr": lr * 10.0},
             {"params": fc_b, "lr": lr * 20.0}],
            lr=lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        poly = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: (1 - step / NUM_STEPS) ** POWER)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": poly, "interval": "step"}}


def main():
    L.seed_everything(RANDOM_SEED, verbose=False)
    dataset = ShapesVOC()
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True,
                        generator=torch.Generator().manual_seed(RANDOM_SEED))
    net = DeepLabResNetModel()
    restore_bn_statistics(net, DataLoader(dataset, batch_size=20))
    model = DCSPSegmentation(net)
    trainer = L.Trainer(max_steps=NUM_STEPS, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader)


if __name__ == "__main__":
    main()
