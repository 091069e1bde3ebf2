"""Crowd-counting FCN trained with an mmcv-style ``Fp16OptimizerHook`` and a static loss scale.

The codebase follows the OpenMMLab 2.x recipe for fp16: ``wrap_fp16_model`` casts the network
to half precision, losses are computed in float32 (``force_fp32``), and the optimizer hook
multiplies the loss by a *fixed* ``loss_scale=512.``, back-propagates through the half model,
copies the fp16 gradients into the fp32 master weights, divides by the scale and steps.

Most training images hold a few dozen people, but a handful are packed stadium shots with
over a thousand.  On the first batch that contains one of them, the scaled gradient of the
loss (512x the true gradient, itself a few hundred) no longer fits in float16: the
half-precision backward produces inf, the hook copies the inf into the master gradients,
AdamW turns the master weights into NaN, and every later loss is nan.  There is no overflow check, because a static scale never expects one.

Reproduces open-mmlab/mmdetection issue #3690 ("Loss scale is set as 512 default for fp16
training, which can sometimes cause gradient overflow.  So I think dynamic loss scale is
necessary"): https://github.com/open-mmlab/mmdetection/issues/3690 ; dynamic loss scaling
was added to mmcv's Fp16OptimizerHook in open-mmlab/mmcv PR #585.

Fix: use a dynamic loss scale (``fp16 = dict(loss_scale='dynamic')``): on overflow the step is
skipped and the scale halved, so training continues.
"""
import argparse
import copy
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

cfg = dict(
    model=dict(in_channels=3, base_channels=8),
    data=dict(num_train=480, samples_per_gpu=16, img_size=32, num_dense=2),
    optimizer=dict(type="AdamW", lr=2e-3, weight_decay=1e-4),
    fp16=dict(loss_scale=512.0),
    total_epochs=4,
    log_config=dict(interval=5),
    seed=8,
)


# ----------------------------------------------------------------------------------------
# fp16 utilities (mmcv.runner.fp16_utils style)
# ----------------------------------------------------------------------------------------
def wrap_fp16_model(model):
    model.half()
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.float()
    model.fp16_enabled = True
    return model


class LossScaler:
    """Static or dynamic loss scaler (the dynamic mode mirrors apex / mmcv)."""

    def __init__(self, init_scale=2 ** 32, mode="dynamic", scale_factor=2.0, scale_window=1000):
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.mode = mode
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.last_overflow_iter = -1

    def has_overflow(self, params):
        if self.mode != "dynamic":
            return False
        for p in params:
            if p.grad is not None and not torch.isfinite(p.grad).all():
                return True
        return False

    def update_scale(self, overflow):
        if self.mode != "dynamic":
            return
        if overflow:
            self.cur_scale = max(self.cur_scale / self.scale_factor, 1)
            self.last_overflow_iter = self.cur_iter
        elif (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
            self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    @property
    def loss_scale(self):
        return self.cur_scale


class Fp16OptimizerHook:
    def __init__(self, grad_clip=None, loss_scale=512.0):
        self.grad_clip = grad_clip
        if loss_scale == "dynamic":
            self.loss_scaler = LossScaler(init_scale=2 ** 16, mode="dynamic", scale_window=50)
        else:
            self.loss_scaler = LossScaler(init_scale=loss_scale, mode="static")

    def before_run(self, runner):
        # keep a copy of fp32 weights in the optimizer
        runner.optimizer.param_groups = copy.deepcopy(runner.optimizer.param_groups)
        wrap_fp16_model(runner.model)

    @staticmethod
    def copy_grads_to_fp32(fp16_net, fp32_weights):
        for fp32_param, fp16_param in zip(fp32_weights, fp16_net.parameters()):
            if fp16_param.grad is not None:
                if fp32_param.grad is None:
                    fp32_param.grad = fp32_param.data.new(fp32_param.size())
                fp32_param.grad.copy_(fp16_param.grad)

    @staticmethod
    def copy_params_to_fp16(fp16_net, fp32_weights):
        for fp16_param, fp32_param in zip(fp16_net.parameters(), fp32_weights):
            fp16_param.data.copy_(fp32_param.data)

    def after_train_iter(self, runner):
        runner.model.zero_grad()
        runner.optimizer.zero_grad()
        scaled_loss = runner.outputs["loss"] * self.loss_scaler.loss_scale
        scaled_loss.backward()
        fp32_weights = []
        for group in runner.optimizer.param_groups:
            fp32_weights += group["params"]
        self.copy_grads_to_fp32(runner.model, fp32_weights)
        has_overflow = self.loss_scaler.has_overflow(fp32_weights)
        if not has_overflow:
            for p in fp32_weights:
                if p.grad is not None:
                    p.grad.div_(self.loss_scaler.loss_scale)
            if self.grad_clip is not None:
                nn.utils.clip_grad_norm_(fp32_weights, **self.grad_clip)
            runner.optimizer.step()
            self.copy_params_to_fp16(runner.model, fp32_weights)
        else:
            runner.log(f"Check overflow, downscale loss scale to {self.loss_scaler.cur_scale / 2}")
        self.loss_scaler.update_scale(has_overflow)


# ----------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------
def gaussian_density(points, size, sigma=1.5):
    yy, xx = np.mgrid[0:size, 0:size]
    dens = np.zeros((size, size), dtype=np.float32)
    for (x, y) in points:
        g = np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / (2 * sigma ** 2))
        dens += g / g.sum()
    return dens


class CrowdDataset(torch.utils.data.Dataset):
    """Synthetic crowd images: bright blobs = heads, density maps summing to the count."""

    def __init__(self, num, img_size, num_dense, seed):
        rng = np.random.RandomState(seed)
        self.imgs, self.dens = [], []
        dense_ids = set(rng.choice(num, num_dense, replace=False).tolist())
        for i in range(num):
            count = rng.randint(1200, 1600) if i in dense_ids else rng.randint(5, 40)
            pts = rng.uniform(1, img_size - 1, size=(count, 2))
            img = 0.05 * rng.randn(3, img_size, img_size).astype(np.float32)
            for (x, y) in pts:
                img[:, int(y), int(x)] += rng.uniform(0.5, 1.0, size=3)
            self.imgs.append(img)
            self.dens.append(gaussian_density(pts, img_size)[None])

    def __len__(self):
        return len(self.imgs)

    def __getitem__(self, idx):
        return dict(img=torch.from_numpy(self.imgs[idx]), gt_density=torch.from_numpy(self.dens[idx]))


# ----------------------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------------------
class DensityCounter(nn.Module):
    def __init__(self, in_channels=3, base_channels=16):
        super().__init__()
        c = base_channels
        self.backbone = nn.Sequential(
            nn.Conv2d(in_channels, c, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(2 * c, 2 * c, 3, padding=2, dilation=2), nn.ReLU(inplace=True),
        )
        self.head = nn.Conv2d(2 * c, 1, 1)
        self.fp16_enabled = False
        self.init_weights()

    def init_weights(self):
        # mmcv normal_init(self.head, std=0.01)
        nn.init.normal_(self.head.weight, 0, 0.01)
        nn.init.constant_(self.head.bias, 0)

    def forward_train(self, img, gt_density):
        if self.fp16_enabled:
            img = img.half()
        pred = self.head(self.backbone(img))
        return self.loss(pred, gt_density)

    def loss(self, pred, gt_density):
        # @force_fp32(apply_to=('pred',))
        pred = pred.float()
        loss_density = F.mse_loss(pred, gt_density, reduction="sum") / pred.size(0)
        count_err = pred.sum(dim=(1, 2, 3)) - gt_density.sum(dim=(1, 2, 3))
        loss_count = 0.001 * count_err.pow(2).mean()
        return dict(loss_density=loss_density, loss_count=loss_count,
                    mae=count_err.abs().mean().detach())

    def train_step(self, data, optimizer):
        losses = self.forward_train(**data)
        loss = losses["loss_density"] + losses["loss_count"]
        log_vars = {k: v.item() for k, v in losses.items()}
        log_vars["loss"] = loss.item()
        return dict(loss=loss, log_vars=log_vars, num_samples=data["img"].size(0))


# ----------------------------------------------------------------------------------------
# runner
# ----------------------------------------------------------------------------------------
class EpochBasedRunner:
    def __init__(self, model, optimizer, max_epochs, log_interval):
        self.model = model
        self.optimizer = optimizer
        self.max_epochs = max_epochs
        self.log_interval = log_interval
        self.hooks = []
        self.iter = 0
        self.outputs = None

    def register_hook(self, hook):
        self.hooks.append(hook)

    def log(self, msg):
        print(msg)

    def call_hook(self, name):
        for h in self.hooks:
            fn = getattr(h, name, None)
            if fn is not None:
                fn(self)

    def run(self, data_loader):
        self.call_hook("before_run")
        for epoch in range(self.max_epochs):
            self.model.train()
            for i, data in enumerate(data_loader):
                self.outputs = self.model.train_step(data, self.optimizer)
                self.call_hook("after_train_iter")
                if self.iter % self.log_interval == 0:
                    lv = self.outputs["log_vars"]
                    self.log(f"Epoch [{epoch + 1}][{i + 1}/{len(data_loader)}]\titer: {self.iter}, "
                             f"loss_density: {lv['loss_density']:.4f}, loss_count: {lv['loss_count']:.4f}, "
                             f"mae: {lv['mae']:.2f}, loss: {lv['loss']:.4f}")
                self.iter += 1


def build_optimizer(model, cfg):
    cfg = dict(cfg)
    opt_type = cfg.pop("type")
    return getattr(torch.optim, opt_type)(model.parameters(), **cfg)


def main():
    parser = argparse.ArgumentParser(description="Train a density counter")
    parser.add_argument("--loss-scale", default=None, help="override fp16 loss_scale (e.g. dynamic)")
    args = parser.parse_args()
    if args.loss_scale is not None:
        cfg["fp16"]["loss_scale"] = args.loss_scale if args.loss_scale == "dynamic" else float(args.loss_scale)

    torch.manual_seed(cfg["seed"])
    np.random.seed(cfg["seed"])
    torch.set_num_threads(1)

    d = cfg["data"]
    dataset = CrowdDataset(d["num_train"], d["img_size"], d["num_dense"], seed=cfg["seed"])
    loader = torch.utils.data.DataLoader(dataset, batch_size=d["samples_per_gpu"], shuffle=True)

    model = DensityCounter(**cfg["model"])
    optimizer = build_optimizer(model, cfg["optimizer"])
    runner = EpochBasedRunner(model, optimizer, cfg["total_epochs"], cfg["log_config"]["interval"])
    runner.register_hook(Fp16OptimizerHook(**cfg["fp16"]))
    runner.run(loader)


if __name__ == "__main__":
    main()
