"""
World Models style MDN-RNN trained on pre-encoded rollouts (series/*.npz holding the VAE's
mu / log_var per frame plus the action).  z is sampled from N(mu, exp(log_var)) when the series
are loaded, then an LSTM + mixture density head learns p(z_{t+1} | z_t, a_t, h_t).

Bug: a handful of frames in one late rollout file were corrupt (garbled observations).  The VAE
had never seen anything like them and gave them an absurd log variance, so
exp(log_var / 2) overflows float32 for those frames and the sampled z is +/-inf.  The
episodes are served in file order, so training looks fine for several hundred steps until the
batch holding that rollout arrives; from then on the loss and all weights are nan.

Report: https://github.com/AppliedDataSciencePartners/WorldModels/issues/14
Fix: skip the corrupt rollout (drop any episode whose encoding is not finite) when loading the
series, as the reporter did.
"""
import argparse
import glob
import math
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn

Z_DIM, A_DIM, T = 8, 3, 48


def write_rollouts(root, n_episodes, seed=0):
    """Stand-in for 02_generate_data.py + 03_generate_rnn_data.py output."""
    rng = np.random.RandomState(seed)
    os.makedirs(root, exist_ok=True)
    mix = rng.randn(A_DIM, Z_DIM).astype(np.float32) * 0.3
    for ep in range(n_episodes):
        action = np.tanh(rng.randn(T, A_DIM)).astype(np.float32)
        mu = np.zeros((T, Z_DIM), np.float32)
        mu[0] = rng.randn(Z_DIM)
        for t in range(1, T):
            mu[t] = 0.9 * mu[t - 1] + action[t - 1] @ mix + 0.1 * rng.randn(Z_DIM)
        log_var = (-4.0 + 0.3 * rng.randn(T, Z_DIM)).astype(np.float32)
        if ep == 731:
            # recorder glitch: frames 20-25 are garbage, the encoder blows up on them
            log_var[20:26] = rng.uniform(180.0, 260.0, size=(6, Z_DIM))
            mu[20:26] = rng.uniform(-40.0, 40.0, size=(6, Z_DIM))
        np.savez(os.path.join(root, "rollout_%04d.npz" % ep), mu=mu, log_var=log_var, action=action)


def load_series(root, seed=0):
    rng = np.random.RandomState(seed)
    z_list, a_list = [], []
    for fn in sorted(glob.glob(os.path.join(root, "rollout_*.npz"))):
        d = np.load(fn)
        mu, log_var = d["mu"], d["log_var"]
        z = mu + np.exp(log_var / 2.0) * rng.randn(*mu.shape).astype(np.float32)
        z_list.append(z.astype(np.float32))
        a_list.append(d["action"])
    return np.stack(z_list), np.stack(a_list)


class MDNRNN(nn.Module):
    def __init__(self, z_dim=Z_DIM, a_dim=A_DIM, hidden=64, n_mix=5):
        super().__init__()
        self.z_dim, self.n_mix = z_dim, n_mix
        self.lstm = nn.LSTM(z_dim + a_dim, hidden, batch_first=True)
        self.mdn = nn.Linear(hidden, n_mix * (2 * z_dim + 1))

    def forward(self, z, a):
        h, _ = self.lstm(torch.cat([z, a], dim=-1))
        out = self.mdn(h)
        B, L, _ = out.shape
        logpi = out[..., : self.n_mix]
        mu = out[..., self.n_mix: self.n_mix * (1 + self.z_dim)].view(B, L, self.n_mix, self.z_dim)
        logsigma = out[..., self.n_mix * (1 + self.z_dim):].view(B, L, self.n_mix, self.z_dim)
        return torch.log_softmax(logpi, -1), mu, logsigma.clamp(-7, 7)


def mdn_loss(logpi, mu, logsigma, target):
    target = target.unsqueeze(2)
    log_prob = -0.5 * ((target - mu) / logsigma.exp()) ** 2 - logsigma - 0.5 * math.log(2 * math.pi)
    log_prob = log_prob.sum(-1) + logpi
    return -torch.logsumexp(log_prob, dim=-1).mean()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--episodes", type=int, default=1000)
    p.add_argument("--batch_size", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    root = os.path.join(tempfile.mkdtemp(), "series")
    write_rollouts(root, args.episodes)
    z, a = load_series(root)
    print("loaded series", z.shape, a.shape)
    z, a = torch.from_numpy(z), torch.from_numpy(a)

    model = MDNRNN()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    step = 0
    for epoch in range(args.epochs):
        for i in range(0, len(z), args.batch_size):
            zb, ab = z[i:i + args.batch_size], a[i:i + args.batch_size]
            logpi, mu, logsigma = model(zb[:, :-1], ab[:, :-1])
            loss = mdn_loss(logpi, mu, logsigma, zb[:, 1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 25 == 0:
                print("epoch %d step %d  mdn loss %.4f" % (epoch, step, loss.item()))


if __name__ == "__main__":
    main()
