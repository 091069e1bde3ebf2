"""YOLOv1 detector trained from scratch with SGD (a scaled-down copy of a small
"yolov1-pytorch" project: argparse flags, cfg dicts, conv+BN backbone, two FC
layers ending in a Sigmoid, the sum-squared YOLOv1 loss with sqrt(w), sqrt(h)).

Setting: synthetic 112x112 images with 1-3 coloured boxes of 20 classes, labels
encoded on a 7x7 grid (x, y, w, h, conf duplicated for the B=2 boxes + one-hot
class), SGD momentum 0.9, weight decay 5e-4, batch size 8.

Bug (https://github.com/ivanwhaf/yolov1-pytorch/issues/4): "I run your code with
the default lr=0.02 but get Loss: nan, my batchsize=8".  With lr 0.02 the first
FC layer (fan-in 12544) takes huge steps, the pre-sigmoid outputs saturate and a
predicted w or h becomes exactly 0.0; the loss is still finite (4.55), but the
backward of sqrt(0) is inf, every gradient turns NaN (global iteration 22 =
epoch 1, batch 1), the SGD step writes NaN into all weights and every loss
printed from epoch 1 on is nan.

Fix (maintainer's answer, confirmed by the reporter): "maybe your learning rate
is too big, better lower than 0.01" - with --lr 0.005 the same run trains
(train loss 22.0 -> 3.55, val 5.39 -> 3.69, test 3.21) without any nan.
"""
import argparse
import time

import numpy as np
import torch
from torch import nn
from torch.optim import SGD
from torch.utils.data import DataLoader, Dataset, random_split

parser = argparse.ArgumentParser(description='YOLOv1-pytorch')
parser.add_argument("--epochs", "-e", default=6, help="Training epochs", type=int)
parser.add_argument("--lr", "-lr", default=0.02, help="Training learning rate", type=float)
parser.add_argument("--batch_size", "-bs", default=8, help="Training batch size", type=int)
parser.add_argument("--num_images", "-n", default=200, help="Number of synthetic images", type=int)
parser.add_argument("--seed", default=0, help="Random seed", type=int)
args = parser.parse_args()

# contents of cfg/yolov1.yaml and cfg/dataset.yaml
YOLOV1_CFG = {'S': 7, 'B': 2, 'num_classes': 20, 'input_size': 112}
DATASET_CFG = {'train_proportion': 0.8, 'val_proportion': 0.1, 'test_proportion': 0.1}


class YOLOv1(nn.Module):
    """YOLOv1 model structure: yolo-v1 = conv + fc (scaled down)."""

    def __init__(self, S, B, num_classes):
        super(YOLOv1, self).__init__()
        self.S = S
        self.B = B
        self.num_classes = num_classes

        # conv part: 112*112*3 -> 7*7*256
        self.conv_layers = nn.Sequential(
            nn.Conv2d(3, 32, 7, stride=2, padding=3),
            nn.BatchNorm2d(32),
            nn.LeakyReLU(0.1, inplace=True),
            nn.MaxPool2d(2, stride=2),

            nn.Conv2d(32, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.LeakyReLU(0.1, inplace=True),
            nn.MaxPool2d(2, stride=2),

            nn.Conv2d(64, 128, 3, padding=1),
            nn.BatchNorm2d(128),
            nn.LeakyReLU(0.1, inplace=True),
            nn.MaxPool2d(2, stride=2),

            nn.Conv2d(128, 256, 3, padding=1),
            nn.BatchNorm2d(256),
            nn.LeakyReLU(0.1, inplace=True),
        )

        # full connection part
        self.fc_layers = nn.Sequential(
            nn.Linear(7 * 7 * 256, 1024),
            nn.LeakyReLU(0.1, inplace=True),
            nn.Dropout(0.5),
            nn.Linear(1024, self.S * self.S * (self.B * 5 + self.num_classes)),
            nn.Sigmoid()  # normalized to 0~1
        )

    def forward(self, x):
        out = self.conv_layers(x)  # b*256*7*7
        out = out.view(out.size()[0], -1)
        out = self.fc_layers(out)
        out = out.reshape(-1, self.S, self.S, self.B * 5 + self.num_classes)
        return out


def calculate_iou(bbox1, bbox2):
    # bbox: x y w h (centre format), element-wise over the grid
    area1 = bbox1[..., 2] * bbox1[..., 3]
    area2 = bbox2[..., 2] * bbox2[..., 3]
    max_left = torch.max(bbox1[..., 0] - bbox1[..., 2] / 2, bbox2[..., 0] - bbox2[..., 2] / 2)
    min_right = torch.min(bbox1[..., 0] + bbox1[..., 2] / 2, bbox2[..., 0] + bbox2[..., 2] / 2)
    max_top = torch.max(bbox1[..., 1] - bbox1[..., 3] / 2, bbox2[..., 1] - bbox2[..., 3] / 2)
    min_bottom = torch.min(bbox1[..., 1] + bbox1[..., 3] / 2, bbox2[..., 1] + bbox2[..., 3] / 2)
    intersect = (min_right - max_left).clamp(min=0) * (min_bottom - max_top).clamp(min=0)
    overlap = (max_left < min_right) & (max_top < min_bottom)
    return torch.where(overlap, intersect / (area1 + area2 - intersect), torch.zeros_like(intersect))


class YOLOv1Loss(nn.Module):
    """Sum-squared YOLOv1 loss; the box with the larger IoU is responsible."""

    def __init__(self, S, B):
        super().__init__()
        self.S = S
        self.B = B

    def forward(self, preds, labels):
        batch_size = labels.size(0)
        has_obj = labels[..., 4] == 1
        no_obj = ~has_obj

        with torch.no_grad():  # iou is a target, not differentiated
            iou1 = calculate_iou(preds[..., 0:4], labels[..., 0:4])
            iou2 = calculate_iou(preds[..., 5:9], labels[..., 0:4])
        resp1 = has_obj & (iou1 > iou2)
        resp2 = has_obj & ~(iou1 > iou2)

        # coord xy loss
        loss_coord_xy = 5 * (((labels[..., 0:2] - preds[..., 0:2]) ** 2).sum(-1) * resp1
                             + ((labels[..., 5:7] - preds[..., 5:7]) ** 2).sum(-1) * resp2).sum()
        # coord wh loss
        loss_coord_wh = (((labels[..., 2:4].sqrt() - preds[..., 2:4].sqrt()) ** 2).sum(-1) * resp1
                         + ((labels[..., 7:9].sqrt() - preds[..., 7:9].sqrt()) ** 2).sum(-1) * resp2).sum()
        # obj confidence loss
        loss_obj = (((iou1 - preds[..., 4]) ** 2) * resp1 + ((iou2 - preds[..., 9]) ** 2) * resp2).sum()
        # no obj confidence loss
        loss_no_obj = (0.5 * (preds[..., 9] ** 2) * resp1 + 0.5 * (preds[..., 4] ** 2) * resp2
                       + 0.5 * ((preds[..., 4] ** 2) + (preds[..., 9] ** 2)) * no_obj).sum()
        # class loss
        loss_class = (((labels[..., 10:] - preds[..., 10:]) ** 2).sum(-1) * has_obj).sum()

        loss = loss_coord_xy + loss_coord_wh + loss_obj + loss_no_obj + loss_class  # five loss terms
        return loss / batch_size


def xywhc2label(bboxs, S, B, num_classes):
    # bboxs is a xywhc list: [(x,y,w,h,c),(x,y,w,h,c),....]
    label = np.zeros((S, S, 5 * B + num_classes), dtype=np.float32)
    for x, y, w, h, c in bboxs:
        x_grid = int(x // (1.0 / S))
        y_grid = int(y // (1.0 / S))
        label[y_grid, x_grid, 0:5] = np.array([x, y, w, h, 1])
        label[y_grid, x_grid, 5:10] = np.array([x, y, w, h, 1])
        label[y_grid, x_grid, 10 + c] = 1
    return label


class YOLODataset(Dataset):
    """In-memory stand-in for the image/label folders: coloured boxes on noise."""

    def __init__(self, n, S, B, num_classes, input_size, seed=0):
        rng = np.random.RandomState(seed)
        colors = rng.rand(num_classes, 3)
        self.images, self.labels = [], []
        for _ in range(n):
            img = 0.5 + 0.1 * rng.randn(3, input_size, input_size)
            xywhc = []
            for _ in range(rng.randint(1, 4)):
                c = rng.randint(num_classes)
                w, h = rng.uniform(0.15, 0.5, 2)
                x, y = rng.uniform(w / 2, 1 - w / 2), rng.uniform(h / 2, 1 - h / 2)
                x0, x1 = int((x - w / 2) * input_size), int((x + w / 2) * input_size)
                y0, y1 = int((y - h / 2) * input_size), int((y + h / 2) * input_size)
                img[:, y0:y1, x0:x1] = colors[c][:, None, None] + 0.05 * rng.randn(3, y1 - y0, x1 - x0)
                xywhc.append((x, y, w, h, c))
            self.images.append(torch.from_numpy(np.clip(img, 0, 1).astype(np.float32)))
            self.labels.append(torch.from_numpy(xywhc2label(xywhc, S, B, num_classes)))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, idx):
        return self.images[idx], self.labels[idx]


def create_dataloader(n, train_proportion, val_proportion, batch_size, input_size, S, B, num_classes):
    dataset = YOLODataset(n, S, B, num_classes, input_size, seed=args.seed)
    train_size = int(n * train_proportion)
    val_size = int(n * val_proportion)
    test_size = n - train_size - val_size
    train_dataset, val_dataset, test_dataset = random_split(dataset, [train_size, val_size, test_size])
    train_loader = DataLoader(train_dataset, batch_size=batch_size, shuffle=False)
    val_loader = DataLoader(val_dataset, batch_size=batch_size, shuffle=False)
    test_loader = DataLoader(test_dataset, batch_size=batch_size, shuffle=False)
    return train_loader, val_loader, test_loader


def train(model, train_loader, optimizer, epoch, device, S, B, train_loss_lst):
    model.train()  # Set the module in training mode
    train_loss = 0
    for batch_idx, (inputs, labels) in enumerate(train_loader):
        t_start = time.time()
        inputs, labels = inputs.to(device), labels.to(device)
        outputs = model(inputs)

        # back prop
        criterion = YOLOv1Loss(S, B)
        loss = criterion(outputs, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_loss += loss.item()
        t_batch = time.time() - t_start

        # print loss
        if batch_idx % 10 == 0:
            print('Train Epoch: {} [{}/{} ({:.1f}%)]  Time: {:.4f}s  Loss: {:.6f}'
                  .format(epoch, batch_idx * len(inputs), len(train_loader.dataset),
                          100. * batch_idx / len(train_loader), t_batch, loss.item()))

    train_loss /= len(train_loader)
    train_loss_lst.append(train_loss)
    return train_loss_lst


def validate(model, val_loader, device, S, B, val_loss_lst):
    model.eval()  # Sets the module in evaluation mode
    val_loss = 0
    with torch.no_grad():
        for data, target in val_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            criterion = YOLOv1Loss(S, B)
            val_loss += criterion(output, target).item()
    val_loss /= len(val_loader)
    print('Val set: Average loss: {:.4f}\n'.format(val_loss))
    val_loss_lst.append(val_loss)
    return val_loss_lst


def test(model, test_loader, device, S, B):
    model.eval()
    test_loss = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            criterion = YOLOv1Loss(S, B)
            test_loss += criterion(output, target).item()
    test_loss /= len(test_loader)
    print('Test set: Average loss: {:.4f}'.format(test_loss))


if __name__ == "__main__":
    torch.manual_seed(args.seed)
    cfg, dataset_cfg = YOLOV1_CFG, DATASET_CFG
    S, B, num_classes, input_size = cfg['S'], cfg['B'], cfg['num_classes'], cfg['input_size']
    device = torch.device("cpu")

    # build model
    model = YOLOv1(S, B, num_classes).to(device)

    # get data loader
    train_loader, val_loader, test_loader = create_dataloader(args.num_images, dataset_cfg['train_proportion'],
                                                              dataset_cfg['val_proportion'], args.batch_size,
                                                              input_size, S, B, num_classes)

    optimizer = SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=0.0005)

    train_loss_lst, val_loss_lst = [], []
    for epoch in range(args.epochs):
        train_loss_lst = train(model, train_loader, optimizer, epoch, device, S, B, train_loss_lst)
        val_loss_lst = validate(model, val_loader, device, S, B, val_loss_lst)

    test(model, test_loader, device, S, B)
