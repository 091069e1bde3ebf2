'''
    Single-process training of a small FlowNet3D-style scene-flow network
    (PyTorch re-write of the TF training loop) on pre-processed
    FlyingThings3D-like point-cloud pairs.

    Setting: a data-preprocessing stage pops every disparity map up into a
    3D point cloud (depth = focal / disparity), sub-samples 1024 points per
    frame, and writes one .npz per scene (points1, points2, color1, color2,
    flow, valid_mask1).  SceneflowDataset globs those files; get_batch()
    draws NUM_POINT points per scene, and the loss is the masked L2 flow
    error.

    Bug: one processed scene, TRAIN_C_0140_left_0006-0.npz, carries non-finite
    flow.  In that frame a patch of pixels has disparity + disparity_change
    == 0, so its future depth focal / 0 is inf, the future positions are
    inf (NaN where the pixel sits on the optical axis) and so is the stored
    flow; the occlusion test marks those points invalid, but the loss
    multiplies mask (0) by an infinite error, which is NaN.  (The report does
    not say how the NaN got into the released file; a zero summed disparity
    is used here as the mechanism.)  Training is fine until the shuffled
    epoch reaches that scene - about half an epoch in, as in the report -
    then the loss is nan, Adam writes NaN into every weight and it stays
    nan.

    Fix (maintainer, commit 3a4b3b6 "added exclusion of a bad nan datapoint
    in the provided processed dataset"): in SceneflowDataset.__init__, drop
    that file from the training list:
        self.datapath = [d for d in self.datapath
                         if 'TRAIN_C_0140_left_0006-0' not in d]

    Report: https://github.com/xingyul/flownet3d/issues/19
'''

import argparse
import glob
import os
import shutil
import tempfile
from datetime import datetime

import numpy as np
import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument('--data', default=None, help='Processed dataset directory [default: generate into a temp dir]')
parser.add_argument('--num_point', type=int, default=128, help='Point Number [default: 128]')
parser.add_argument('--max_epoch', type=int, default=2, help='Epoch to run [default: 2]')
parser.add_argument('--batch_size', type=int, default=8, help='Batch Size during training [default: 8]')
parser.add_argument('--learning_rate', type=float, default=0.001, help='Initial learning rate [default: 0.001]')
parser.add_argument('--decay_step', type=int, default=200000, help='Decay step for lr decay [default: 200000]')
parser.add_argument('--decay_rate', type=float, default=0.7, help='Decay rate for lr decay [default: 0.7]')
FLAGS = parser.parse_args()

BATCH_SIZE = FLAGS.batch_size
NUM_POINT = FLAGS.num_point
MAX_EPOCH = FLAGS.max_epoch
BASE_LEARNING_RATE = FLAGS.learning_rate
DECAY_STEP = FLAGS.decay_step
DECAY_RATE = FLAGS.decay_rate

np.random.seed(19)
torch.manual_seed(19)


def log_string(out_str):
    print(out_str)


# ----------------------------------------------------------------------------
# data preprocessing (run once, writes the "provided processed dataset")
# ----------------------------------------------------------------------------
FOCAL = 105.
H, W = 54, 96


def get_3d_pos_xy(y_prime, x_prime, depth, focal_length=FOCAL, w=W, h=H):
    '''depth pop up'''
    y = (y_prime - h / 2.) * depth / focal_length
    x = (x_prime - w / 2.) * depth / focal_length
    return np.stack([x, y, depth], axis=-1)


def render_frame(rng, glitch=False):
    '''synthetic disparity / disparity change / optical flow / rgb maps'''
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    disparity = rng.uniform(4.5, 6.0) + 0.02 * yy
    rgb = np.tile(rng.uniform(0.2, 0.8, size=3), (H, W, 1))
    flow2d = np.zeros((H, W, 2), np.float32)
    disp_change = np.full((H, W), rng.uniform(-0.1, 0.1), np.float32)
    for _ in range(rng.integers(2, 5)):
        cy, cx = rng.uniform(8, H - 8), rng.uniform(8, W - 8)
        r = rng.uniform(5, 10)
        obj = (yy - cy) ** 2 + (xx - cx) ** 2 < r ** 2
        disparity[obj] = rng.uniform(8, 20)
        rgb[obj] = rng.uniform(0, 1, size=3)
        flow2d[obj] = rng.uniform(-3, 3, size=2)
        disp_change[obj] = rng.uniform(-0.8, 0.8)
    if glitch:
        # rendering glitch: the object's disparity change cancels its disparity
        patch = (yy > 14) & (yy < 38) & (xx > 30) & (xx < 66)
        disparity[patch] = 12.0
        disp_change[patch] = -12.0
        flow2d[patch] = 0.0
    disparity_next = disparity + disp_change
    return disparity, disparity_next, disp_change, flow2d, rgb


def gen_datapoint(disparity_np, disparity_next_frame_np, disparity_change_np, optical_flow_np,
                  rgb_np, rng, n=1024, max_cut=35, focal_length=FOCAL):
    depth_np = focal_length / disparity_np
    depth_next_frame_np = focal_length / np.maximum(disparity_next_frame_np, 1e-3)
    future_depth_np = focal_length / (disparity_np + disparity_change_np)

    ##### point set 1 current pos
    satisfy_pix1 = np.column_stack(np.where(depth_np < max_cut))
    choice1 = rng.choice(satisfy_pix1.shape[0], size=n, replace=False)
    py1, px1 = satisfy_pix1[choice1, 0], satisfy_pix1[choice1, 1]
    current_pos1 = get_3d_pos_xy(py1, px1, depth_np[py1, px1])
    current_rgb1 = rgb_np[py1, px1]

    ##### point set 1 future pos
    fx = px1 + optical_flow_np[py1, px1, 0]
    fy = py1 - optical_flow_np[py1, px1, 1]
    future_pos1 = get_3d_pos_xy(fy, fx, future_depth_np[py1, px1])
    flow = future_pos1 - current_pos1

    ##### point set 2 current pos
    satisfy_pix2 = np.column_stack(np.where(depth_next_frame_np < max_cut))
    choice2 = rng.choice(satisfy_pix2.shape[0], size=n, replace=False)
    py2, px2 = satisfy_pix2[choice2, 0], satisfy_pix2[choice2, 1]
    current_pos2 = get_3d_pos_xy(py2, px2, depth_next_frame_np[py2, px2])
    current_rgb2 = rgb_np[py2, px2]

    ##### mask: moved out of fov or occluded after motion
    fov = (fy > 0) & (fy < H - 1) & (fx > 0) & (fx < W - 1)
    fg_depth = depth_next_frame_np[np.clip(fy.round().astype(int), 0, H - 1),
                                   np.clip(fx.round().astype(int), 0, W - 1)]
    occ = (fg_depth - future_depth_np[py1, px1]) > -5e-1
    mask1 = fov & occ
    return current_pos1, current_pos2, current_rgb1, current_rgb2, flow, mask1


BAD_SCENE_SLOT = 40


def preprocess_dataset(output_dir, n_train=96, n_test=8):
    rng = np.random.default_rng(0)
    names = ['TRAIN_%s_%04d_%s_%04d-0' % ('ABC'[i % 3], 3 * i, ('left', 'right')[i % 2], 6 + i % 4)
             for i in range(n_train)]
    names[BAD_SCENE_SLOT] = 'TRAIN_C_0140_left_0006-0'
    names += ['TEST_A_%04d_right_%04d-0' % (i, 6 + i % 4) for i in range(n_test)]
    for name in names:
        maps = render_frame(rng, glitch=(name == 'TRAIN_C_0140_left_0006-0'))
        pos1, pos2, rgb1, rgb2, flow, mask1 = gen_datapoint(*maps, rng=rng)
        np.savez_compressed(os.path.join(output_dir, name + '.npz'),
                            points1=pos1.astype(np.float32), points2=pos2.astype(np.float32),
                            color1=(rgb1 * 255).astype(np.uint8), color2=(rgb2 * 255).astype(np.uint8),
                            flow=flow.astype(np.float32), valid_mask1=mask1)


# ----------------------------------------------------------------------------
# dataset
# ----------------------------------------------------------------------------
class SceneflowDataset():
    def __init__(self, root, npoints=2048, train=True):
        self.npoints = npoints
        self.train = train
        self.root = root
        if self.train:
            self.datapath = sorted(glob.glob(os.path.join(self.root, 'TRAIN*.npz')))
        else:
            self.datapath = sorted(glob.glob(os.path.join(self.root, 'TEST*.npz')))
        self.cache = {}
        self.cache_size = 30000

    def __getitem__(self, index):
        if index in self.cache:
            pos1, pos2, color1, color2, flow, mask1 = self.cache[index]
        else:
            fn = self.datapath[index]
            with open(fn, 'rb') as fp:
                data = np.load(fp)
                pos1 = data['points1']
                pos2 = data['points2']
                color1 = data['color1'] / 255
                color2 = data['color2'] / 255
                flow = data['flow']
                mask1 = data['valid_mask1']
            if len(self.cache) < self.cache_size:
                self.cache[index] = (pos1, pos2, color1, color2, flow, mask1)

        if self.train:
            sample_idx1 = np.random.choice(pos1.shape[0], self.npoints, replace=False)
            sample_idx2 = np.random.choice(pos2.shape[0], self.npoints, replace=False)
        else:
            sample_idx1 = sample_idx2 = np.arange(self.npoints)
        return (pos1[sample_idx1].copy(), pos2[sample_idx2].copy(), color1[sample_idx1],
                color2[sample_idx2], flow[sample_idx1], mask1[sample_idx1])

    def __len__(self):
        return len(self.datapath)


# ----------------------------------------------------------------------------
# model
# ----------------------------------------------------------------------------
def shared_mlp(channels):
    """per-point MLP (1x1 conv), applied on channels-last tensors"""
    layers = []
    for cin, cout in zip(channels[:-1], channels[1:]):
        layers += [nn.Linear(cin, cout), nn.ReLU()]
    return nn.Sequential(*layers)


class FlowNet3DLite(nn.Module):
    def __init__(self, k=8):
        super().__init__()
        self.k = k
        self.set_conv = shared_mlp([6, 32, 64])
        self.flow_embedding = shared_mlp([64 + 64 + 3, 64, 64])
        self.flow_head = nn.Sequential(shared_mlp([64 + 64, 64, 64]), nn.Linear(64, 3))

    def forward(self, point_cloud):
        xyz1, xyz2 = point_cloud[:, :NUM_POINT, :3], point_cloud[:, NUM_POINT:, :3]
        feat1 = self.set_conv(point_cloud[:, :NUM_POINT])                  # B,N,C
        feat2 = self.set_conv(point_cloud[:, NUM_POINT:])
        idx = torch.cdist(xyz1, xyz2).topk(self.k, dim=-1, largest=False).indices  # B,N,k
        b = torch.arange(xyz1.shape[0])[:, None, None]
        nn_xyz = xyz2[b, idx] - xyz1[:, :, None, :]                         # B,N,k,3
        nn_feat = feat2[b, idx]                                             # B,N,k,C
        f1 = feat1[:, :, None, :].expand(-1, -1, self.k, -1)
        emb = self.flow_embedding(torch.cat([f1, nn_feat, nn_xyz], dim=-1))
        emb = emb.max(dim=2).values                                         # B,N,C
        return self.flow_head(torch.cat([emb, feat1], dim=-1))              # B,N,3


def get_loss(pred, label, mask):
    return torch.mean(mask * torch.sum((pred - label) * (pred - label), dim=2) / 2.0)


def get_learning_rate(step):
    lr = BASE_LEARNING_RATE * DECAY_RATE ** ((step * BATCH_SIZE) // DECAY_STEP)
    return max(lr, 0.00001)


def get_batch(dataset, idxs, start_idx, end_idx):
    bsize = end_idx - start_idx
    batch_data = np.zeros((bsize, NUM_POINT * 2, 6), np.float32)
    batch_label = np.zeros((bsize, NUM_POINT, 3), np.float32)
    batch_mask = np.zeros((bsize, NUM_POINT), np.float32)
    shuffle_idx = np.arange(NUM_POINT)
    np.random.shuffle(shuffle_idx)
    for i in range(bsize):
        pc1, pc2, color1, color2, flow, mask1 = dataset[idxs[i + start_idx]]
        pc1_center = np.mean(pc1, 0)
        pc1 -= pc1_center
        pc2 -= pc1_center
        batch_data[i, :NUM_POINT, :3] = pc1[shuffle_idx]
        batch_data[i, :NUM_POINT, 3:] = color1[shuffle_idx]
        batch_data[i, NUM_POINT:, :3] = pc2[shuffle_idx]
        batch_data[i, NUM_POINT:, 3:] = color2[shuffle_idx]
        batch_label[i] = flow[shuffle_idx]
        batch_mask[i] = mask1[shuffle_idx]
    return torch.from_numpy(batch_data), torch.from_numpy(batch_label), torch.from_numpy(batch_mask)


def train_one_epoch(model, optimizer, dataset, global_step):
    model.train()
    train_idxs = np.arange(0, len(dataset))
    np.random.shuffle(train_idxs)
    num_batches = len(dataset) // BATCH_SIZE
    log_string(str(datetime.now()))
    for batch_idx in range(num_batches):
        start_idx, end_idx = batch_idx * BATCH_SIZE, (batch_idx + 1) * BATCH_SIZE
        batch_data, batch_label, batch_mask = get_batch(dataset, train_idxs, start_idx, end_idx)
        for g in optimizer.param_groups:
            g['lr'] = get_learning_rate(global_step)
        pred = model(batch_data)
        loss = get_loss(pred, batch_label, batch_mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        global_step += 1
        log_string(' -- %03d / %03d -- loss: %f' % (batch_idx + 1, num_batches, loss.item()))
    return global_step


def eval_one_epoch(model, dataset):
    model.eval()
    idxs = np.arange(len(dataset))
    with torch.no_grad():
        batch_data, batch_label, batch_mask = get_batch(dataset, idxs, 0, len(dataset))
        loss = get_loss(model(batch_data), batch_label, batch_mask)
    log_string('eval mean loss: %f' % loss.item())


def train():
    data_dir = FLAGS.data
    tmp_dir = None
    if data_dir is None:
        tmp_dir = data_dir = tempfile.mkdtemp(prefix='flownet3d_processed_')
        preprocess_dataset(data_dir)
    try:
        TRAIN_DATASET = SceneflowDataset(data_dir, npoints=NUM_POINT)
        TEST_DATASET = SceneflowDataset(data_dir, npoints=NUM_POINT, train=False)
        log_string('train scenes: %d  test scenes: %d' % (len(TRAIN_DATASET), len(TEST_DATASET)))

        model = FlowNet3DLite()
        optimizer = torch.optim.Adam(model.parameters(), lr=BASE_LEARNING_RATE)
        global_step = 0
        for epoch in range(MAX_EPOCH):
            log_string('**** EPOCH %03d ****' % epoch)
            global_step = train_one_epoch(model, optimizer, TRAIN_DATASET, global_step)
            eval_one_epoch(model, TEST_DATASET)
    finally:
        if tmp_dir is not None:
            shutil.rmtree(tmp_dir, ignore_errors=True)


if __name__ == '__main__':
    log_string('pid: %s' % str(os.getpid()))
    train()
