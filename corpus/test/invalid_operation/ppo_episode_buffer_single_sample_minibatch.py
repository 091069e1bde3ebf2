"""PPO (clipped surrogate, GAE) on a NumPy re-implementation of CartPole.

Each update collects whole episodes until at least `rollout_steps` transitions are in
the buffer, then runs several epochs of shuffled minibatch updates.
"""
import math

import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical

CONFIG = {
    "rollout_steps": 512,
    "minibatch_size": 64,
    "epochs": 4,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "clip_range": 0.2,
    "vf_coef": 0.5,
    "ent_coef": 0.01,
    "lr": 3e-4,
    "updates": 60,
    "seed": 2,
}


class CartPole:
    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.state = None

    def reset(self):
        self.state = self.rng.uniform(-0.05, 0.05, size=4)
        self.t = 0
        return self.state.astype(np.float32)

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state
        force = self.force_mag if action == 1 else -self.force_mag
        total_mass = self.masscart + self.masspole
        pml = self.masspole * self.length
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + pml * theta_dot ** 2 * sin) / total_mass
        theta_acc = (self.gravity * sin - cos * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * cos ** 2 / total_mass))
        x_acc = temp - pml * theta_acc * cos / total_mass
        x, x_dot = x + self.tau * x_dot, x_dot + self.tau * x_acc
        theta, theta_dot = theta + self.tau * theta_dot, theta_dot + self.tau * theta_acc
        self.state = np.array([x, x_dot, theta, theta_dot])
        self.t += 1
        done = abs(x) > 2.4 or abs(theta) > 0.2095 or self.t >= 500
        return self.state.astype(np.float32), 1.0, done


class ActorCritic(nn.Module):
    def __init__(self, obs_dim=4, n_actions=2, hidden=64):
        super().__init__()
        self.pi = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(),
                                nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, n_actions))
        self.v = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(),
                               nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def dist(self, obs):
        return Categorical(logits=self.pi(obs))


def collect_episodes(env, model, cfg):
    obs_buf, act_buf, logp_buf, rew_buf, done_buf, val_buf, ep_returns = [], [], [], [], [], [], []
    while len(obs_buf) < cfg["rollout_steps"]:
        obs, done, ep_ret = env.reset(), False, 0.0
        while not done:
            with torch.no_grad():
                o = torch.from_numpy(obs)
                d = model.dist(o)
                a = d.sample()
                v = model.v(o).item()
            next_obs, r, done = env.step(a.item())
            obs_buf.append(obs); act_buf.append(a.item()); logp_buf.append(d.log_prob(a).item())
            rew_buf.append(r); done_buf.append(done); val_buf.append(v)
            obs, ep_ret = next_obs, ep_ret + r
        ep_returns.append(ep_ret)
    return (np.array(obs_buf), np.array(act_buf), np.array(logp_buf), np.array(rew_buf),
            np.array(done_buf), np.array(val_buf), ep_returns)


def compute_gae(rewards, dones, values, gamma, lam):
    adv = np.zeros_like(rewards)
    last = 0.0
    for t in reversed(range(len(rewards))):
        next_value = 0.0 if dones[t] else values[t + 1]
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * lam * (0.0 if dones[t] else last)
        adv[t] = last
    return adv, adv + values[:-1]


def ppo_update(model, optimizer, batch, cfg):
    obs, acts, old_logp, advantages, returns = batch
    n = len(obs)
    for epoch in range(cfg["epochs"]):
        pg_losses, v_losses = [], []
        perm = torch.randperm(n)
        for start in range(0, n, cfg["minibatch_size"]):
            idx = perm[start:start + cfg["minibatch_size"]]
            dist = model.dist(obs[idx])
            logp = dist.log_prob(acts[idx])
            adv = advantages[idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            ratio = torch.exp(logp - old_logp[idx])
            pg_loss = -torch.min(ratio * adv,
                                 ratio.clamp(1 - cfg["clip_range"], 1 + cfg["clip_range"]) * adv).mean()
            v_loss = (model.v(obs[idx]).squeeze(-1) - returns[idx]).pow(2).mean()
            loss = pg_loss + cfg["vf_coef"] * v_loss - cfg["ent_coef"] * dist.entropy().mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            pg_losses.append(pg_loss.item()); v_losses.append(v_loss.item())
        print(f"    epoch {epoch} minibatches {len(pg_losses)} "
              f"pg_loss {np.mean(pg_losses):.4f} v_loss {np.mean(v_losses):.3f}")


def main(cfg=CONFIG):
    torch.manual_seed(cfg["seed"])
    env = CartPole(cfg["seed"])
    model = ActorCritic()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg["lr"], eps=1e-5)
    for update in range(cfg["updates"]):
        obs, acts, logp, rews, dones, vals, ep_returns = collect_episodes(env, model, cfg)
        adv, ret = compute_gae(rews, dones, np.append(vals, 0.0), cfg["gamma"], cfg["gae_lambda"])
        batch = (torch.as_tensor(obs), torch.as_tensor(acts), torch.as_tensor(logp, dtype=torch.float32),
                 torch.as_tensor(adv, dtype=torch.float32), torch.as_tensor(ret, dtype=torch.float32))
        print(f"update {update:3d} steps {len(obs):5d} episodes {len(ep_returns):3d} "
              f"mean_return {np.mean(ep_returns):7.1f}")
        ppo_update(model, optimizer, batch, cfg)


if __name__ == "__main__":
    main()
