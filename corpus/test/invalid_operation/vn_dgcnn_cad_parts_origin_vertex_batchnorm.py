"""VN-DGCNN style rotation-equivariant point-cloud classifier on CAD part clouds.

Vector Neuron batch norm normalises every 3-vector feature by its length:
``norm = sqrt((x*x).sum(2))`` followed by ``x / norm * bn(norm)``.  Most
edge features are non-zero, but a part whose mesh has a vertex exactly at the
origin (the CAD frame origin, kept because the clouds are already normalised)
produces an all-zero edge feature on that vertex's self-loop in the kNN graph
(x_j - x_i = 0, x_i = 0, x_j cross x_i = 0).  Its length is 0, 0 / 0 = NaN in
the forward pass, and the gradient of sqrt at 0 is inf -> every weight NaN.

Reproduces https://github.com/FlyingGiraffe/vnn/pull/4 ("add EPS to x/norm in
bn layer to avoid nan when some vi = [0,0,0]").
Fix (merged): ``norm = torch.norm(x, dim=2) + EPS`` in VNBatchNorm.
"""
import argparse
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-6


def knn(x, k):
    # x: [B, 3, N]
    inner = -2 * torch.matmul(x.transpose(2, 1), x)
    xx = torch.sum(x ** 2, dim=1, keepdim=True)
    pairwise = -xx - inner - xx.transpose(2, 1)
    return pairwise.topk(k=k, dim=-1)[1]


def get_graph_feature_cross(x, k):
    # x: [B, 1, 3, N] -> [B, 3, 3, N, k]
    B, _, _, N = x.shape
    x = x.view(B, -1, N)
    idx = knn(x, k)
    idx = (idx + torch.arange(B).view(-1, 1, 1) * N).view(-1)
    x = x.transpose(2, 1).contiguous()          # [B, N, 3]
    feature = x.view(B * N, -1)[idx, :].view(B, N, k, 1, 3)
    x = x.view(B, N, 1, 1, 3).repeat(1, 1, k, 1, 1)
    cross = torch.cross(feature, x, dim=-1)
    feature = torch.cat((feature - x, x, cross), dim=3).permute(0, 3, 4, 1, 2).contiguous()
    return feature


class VNBatchNorm(nn.Module):
    def __init__(self, num_features, dim):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features) if dim == 5 else nn.BatchNorm1d(num_features)

    def forward(self, x):
        norm = torch.sqrt((x * x).sum(2))
        norm_bn = self.bn(norm)
        x = x / norm.unsqueeze(2) * norm_bn.unsqueeze(2)
        return x


class VNLinearLeakyReLU(nn.Module):
    def __init__(self, cin, cout, dim=5, negative_slope=0.2):
        super().__init__()
        self.map_to_feat = nn.Linear(cin, cout, bias=False)
        self.map_to_dir = nn.Linear(cin, cout, bias=False)
        self.batchnorm = VNBatchNorm(cout, dim=dim)
        self.negative_slope = negative_slope

    def forward(self, x):
        p = self.map_to_feat(x.transpose(1, -1)).transpose(1, -1)
        p = self.batchnorm(p)
        d = self.map_to_dir(x.transpose(1, -1)).transpose(1, -1)
        dot = (p * d).sum(2, keepdim=True)
        mask = (dot >= 0).float()
        d_norm_sq = (d * d).sum(2, keepdim=True)
        return self.negative_slope * p + (1 - self.negative_slope) * (
            mask * p + (1 - mask) * (p - (dot / (d_norm_sq + EPS)) * d))


class VNDGCNNLite(nn.Module):
    def __init__(self, k=10, num_classes=4, c=16):
        super().__init__()
        self.k = k
        self.conv1 = VNLinearLeakyReLU(3, c)
        self.conv2 = VNLinearLeakyReLU(c, c, dim=4)
        self.conv3 = VNLinearLeakyReLU(c, 2 * c, dim=4)
        self.head = nn.Sequential(nn.Linear(2 * c * 3, 64), nn.BatchNorm1d(64), nn.LeakyReLU(0.2),
                                  nn.Linear(64, num_classes))

    def forward(self, pts):
        x = pts.unsqueeze(1)                       # [B, 1, 3, N]
        x = get_graph_feature_cross(x, self.k)     # [B, 3, 3, N, k]
        x = self.conv1(x).mean(-1)                 # [B, c, 3, N]
        x = self.conv2(x)
        x = self.conv3(x)                          # [B, 2c, 3, N]
        x = x.mean(-1)                             # [B, 2c, 3]
        # invariant readout: inner products with the mean direction
        ref = x.mean(1, keepdim=True)
        inv = torch.einsum('bci,bdi->bcd', x, ref / (ref.norm(dim=-1, keepdim=True) + EPS))
        inv = torch.cat([inv.squeeze(-1), x.norm(dim=-1), (x * x).sum(-1)], dim=1)
        return self.head(inv)


def sample_part(cls, n_points, rng, vertex_at_origin):
    """Surface samples of a synthetic CAD part, already centred / unit-scaled."""
    if cls == 0:     # box
        half = np.array([0.8, 0.5, 0.3])
        p = rng.uniform(-1, 1, (n_points, 3)) * half
        ax = rng.integers(0, 3, n_points)
        p[np.arange(n_points), ax] = np.sign(rng.standard_normal(n_points)) * half[ax]
    elif cls == 1:   # cylinder
        t = rng.uniform(0, 2 * np.pi, n_points)
        p = np.stack([0.5 * np.cos(t), 0.5 * np.sin(t), rng.uniform(-0.9, 0.9, n_points)], 1)
    elif cls == 2:   # sphere
        p = rng.standard_normal((n_points, 3))
        p = 0.8 * p / np.linalg.norm(p, axis=1, keepdims=True)
    else:            # cone
        h = rng.uniform(0, 1, n_points)
        t = rng.uniform(0, 2 * np.pi, n_points)
        p = np.stack([0.6 * h * np.cos(t), 0.6 * h * np.sin(t), 0.9 - 1.5 * h], 1)
    p = p + 0.01 * rng.standard_normal(p.shape)
    if vertex_at_origin:
        # mesh vertices are included in the cloud; this part was modelled around the CAD origin
        p[0] = 0.0
    return p.astype(np.float32)


def build_dataset(n, n_points, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n)
    origin = rng.random(n) < 0.004
    clouds = np.stack([sample_part(c, n_points, rng, o) for c, o in zip(labels, origin)])
    # random SO(3) rotation per part (training with rotation augmentation baked in)
    q = rng.standard_normal((n, 3, 3))
    rot = np.linalg.qr(q)[0].astype(np.float32)
    clouds = np.einsum('bij,bnj->bni', rot, clouds)
    return torch.from_numpy(clouds).transpose(1, 2).contiguous(), torch.from_numpy(labels)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--epochs', type=int, default=2)
    ap.add_argument('--batch_size', type=int, default=16)
    ap.add_argument('--num_points', type=int, default=96)
    ap.add_argument('--k', type=int, default=10)
    ap.add_argument('--lr', type=float, default=1e-3)
    ap.add_argument("--data_seed", type=int, default=6)
    args = ap.parse_args()

    torch.manual_seed(0)
    np.random.seed(0)
    X, y = build_dataset(1200, args.num_points, seed=args.data_seed)
    ds = torch.utils.data.TensorDataset(X, y)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(0))
    model = VNDGCNNLite(k=args.k)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=1e-4)
    step = 0
    for epoch in range(args.epochs):
        model.train()
        correct = total = 0
        for pts, lab in loader:
            logits = model(pts)
            loss = F.cross_entropy(logits, lab)
            opt.zero_grad()
            loss.backward()
            opt.step()
            correct += (logits.argmax(1) == lab).sum().item()
            total += lab.numel()
            if step % 5 == 0:
                print(f'epoch {epoch} step {step:4d} loss {loss.item():.4f} acc {correct / total:.3f}')
            step += 1
        print(f'== epoch {epoch} train acc {correct / total:.3f}')


if __name__ == '__main__':
    main()
