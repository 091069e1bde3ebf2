"""Soft Actor-Critic on a torque-limited pendulum, written after autonomous-learning-library.

The agent follows the library's SAC of early 2020: a SoftDeterministicPolicy that squashes
a Gaussian sample with tanh and rescales it to the action space (tanh_scale = (high -
low) / 2, tanh_mean = (high + low) / 2), two Q networks, a V network with a Polyak target,
and automatic temperature adjustment towards an entropy target.  The pendulum's motor
delivers up to 2 N m, so the action box is [-2, 2] and tanh_scale is 2.

The tanh change-of-variables term of the log-probability is computed from the *rescaled*
action, log(1 - action**2 + 1e-6).  While the policy is close to deterministic and its
torques are small this is harmless, but once the actor has learned to push with more than
1 N m (needed to swing the pendulum up) a sampled |action| > 1 makes the argument negative:
log() returns NaN, the V target and the actor loss become NaN, and every network's weights
follow after the next optimizer step.

Reproduces: https://github.com/cpnota/autonomous-learning-library/issues/139
("log() outputs nan in SoftDeterministicPolicyNetwork.sample()"), fixed in PR #140 by
computing the correction from the raw sample, log(1 - tanh(raw)**2 + 1e-6), and dividing
the log-probability by tanh_scale.
"""
import argparse
import copy

import numpy as np
import torch
import torch.nn as nn
from torch.nn.functional import mse_loss


class Pendulum:
    """Classic torque-limited pendulum swing-up, integrated with dt = 0.05."""
    max_speed, max_torque, dt, g, m, l = 8.0, 2.0, 0.05, 10.0, 1.0, 1.0

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.action_low = np.array([-self.max_torque], dtype=np.float32)
        self.action_high = np.array([self.max_torque], dtype=np.float32)

    def reset(self):
        self.theta = self.rng.uniform(-np.pi, np.pi)
        self.theta_dot = self.rng.uniform(-1.0, 1.0)
        self.t = 0
        return self._obs()

    def _obs(self):
        return np.array([np.cos(self.theta), np.sin(self.theta), self.theta_dot / self.max_speed], dtype=np.float32)

    def step(self, u):
        u = float(np.clip(u, -self.max_torque, self.max_torque))
        angle = ((self.theta + np.pi) % (2 * np.pi)) - np.pi
        cost = angle ** 2 + 0.1 * self.theta_dot ** 2 + 0.001 * u ** 2
        self.theta_dot += (3 * self.g / (2 * self.l) * np.sin(self.theta) + 3.0 / (self.m * self.l ** 2) * u) * self.dt
        self.theta_dot = float(np.clip(self.theta_dot, -self.max_speed, self.max_speed))
        self.theta += self.theta_dot * self.dt
        self.t += 1
        return self._obs(), -cost, self.t >= 200


class ReplayBuffer:
    def __init__(self, size, state_dim, action_dim, seed):
        self.s = np.zeros((size, state_dim), np.float32)
        self.a = np.zeros((size, action_dim), np.float32)
        self.r = np.zeros((size, 1), np.float32)
        self.s2 = np.zeros((size, state_dim), np.float32)
        self.n, self.size = 0, size
        self.rng = np.random.default_rng(seed)

    def store(self, s, a, r, s2):
        i = self.n % self.size
        self.s[i], self.a[i], self.r[i], self.s2[i] = s, a, r, s2
        self.n += 1

    def sample(self, batch_size):
        idx = self.rng.integers(0, min(self.n, self.size), batch_size)
        return (torch.from_numpy(self.s[idx]), torch.from_numpy(self.a[idx]),
                torch.from_numpy(self.r[idx]), torch.from_numpy(self.s2[idx]))


def mlp(inp, out, hidden=64):
    return nn.Sequential(nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, out))


class SoftDeterministicPolicyNetwork(nn.Module):
    def __init__(self, state_dim, low, high, initial_logvar=-4.6):
        super().__init__()
        self.action_dim = len(low)
        self.model = mlp(state_dim, 2 * self.action_dim)
        self.tanh_scale = torch.tensor((high - low) / 2)
        self.tanh_mean = torch.tensor((high + low) / 2)
        with torch.no_grad():   # start almost deterministic; the temperature widens it
            self.model[-1].weight.mul_(0.01)
            self.model[-1].bias.zero_()
            self.model[-1].bias[self.action_dim:] = initial_logvar

    def forward(self, state):
        outputs = self.model(state)
        means = outputs[:, :self.action_dim]
        logvars = outputs[:, self.action_dim:]
        normal = torch.distributions.Normal(means, logvars.mul(0.5).exp(), validate_args=False)
        return self._sample(normal)

    def _sample(self, normal):
        raw = normal.rsample()
        action = self._squash(raw)
        log_prob = normal.log_prob(raw)
        log_prob -= torch.log(1 - action.pow(2) + 1e-6)
        log_prob = log_prob.sum(1)
        return action, log_prob

    def _squash(self, x):
        return torch.tanh(x) * self.tanh_scale + self.tanh_mean


class QNetwork(nn.Module):
    def __init__(self, state_dim, action_dim):
        super().__init__()
        self.model = mlp(state_dim + action_dim, 1)

    def forward(self, s, a):
        return self.model(torch.cat([s, a], 1)).squeeze(-1)


class SAC:
    def __init__(self, env, args):
        self.policy = SoftDeterministicPolicyNetwork(3, env.action_low, env.action_high)
        self.q_1, self.q_2 = QNetwork(3, 1), QNetwork(3, 1)
        self.v = mlp(3, 1)
        self.v_target = copy.deepcopy(self.v)
        self.opt_policy = torch.optim.Adam(self.policy.parameters(), lr=args.lr_pi)
        self.opt_q = torch.optim.Adam(list(self.q_1.parameters()) + list(self.q_2.parameters()), lr=args.lr)
        self.opt_v = torch.optim.Adam(self.v.parameters(), lr=args.lr)
        self.temperature = args.temperature
        self.args = args
        self.stats = {}

    def act(self, state):
        with torch.no_grad():
            action, _ = self.policy(torch.from_numpy(state)[None])
        return action[0].numpy()

    def train_step(self, buffer):
        a = self.args
        states, actions, rewards, next_states = buffer.sample(a.batch_size)
        with torch.no_grad():
            _actions, _log_probs = self.policy(states)
            q_targets = rewards.squeeze(-1) + a.gamma * self.v_target(next_states).squeeze(-1)
            v_targets = torch.min(self.q_1(states, _actions), self.q_2(states, _actions)) - self.temperature * _log_probs

        q_loss = mse_loss(self.q_1(states, actions), q_targets) + mse_loss(self.q_2(states, actions), q_targets)
        self.opt_q.zero_grad()
        q_loss.backward()
        self.opt_q.step()

        v_loss = mse_loss(self.v(states).squeeze(-1), v_targets)
        self.opt_v.zero_grad()
        v_loss.backward()
        self.opt_v.step()

        _actions2, _log_probs2 = self.policy(states)
        policy_loss = (-self.q_1(states, _actions2) + self.temperature * _log_probs2).mean()
        self.opt_policy.zero_grad()
        policy_loss.backward()
        self.opt_policy.step()

        # temperature towards the entropy target
        self.temperature += a.lr_temperature * (_log_probs + a.entropy_target).mean().item()
        self.temperature = max(self.temperature, 0.0)

        with torch.no_grad():
            for p, tp in zip(self.v.parameters(), self.v_target.parameters()):
                tp.mul_(1 - a.polyak).add_(a.polyak * p)
        self.stats = dict(q_loss=q_loss.item(), v_loss=v_loss.item(),
                          policy_loss=policy_loss.item(), entropy=-_log_probs.mean().item())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lr-pi", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--update-frequency", type=int, default=2)
    parser.add_argument("--gamma", type=float, default=0.98)
    parser.add_argument("--polyak", type=float, default=0.005)
    parser.add_argument("--temperature", type=float, default=0.1)
    parser.add_argument("--lr-temperature", type=float, default=1e-4)
    parser.add_argument("--entropy-target", type=float, default=-1.0)
    parser.add_argument("--replay-start", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    env = Pendulum(args.seed)
    agent = SAC(env, args)
    buffer = ReplayBuffer(50_000, 3, 1, args.seed)

    updates = 0
    for episode in range(args.episodes):
        state, done, ret = env.reset(), False, 0.0
        while not done:
            action = agent.act(state)
            next_state, reward, done = env.step(action[0])
            buffer.store(state, action, reward, next_state)
            state, ret = next_state, ret + reward
            if buffer.n >= args.replay_start and buffer.n % args.update_frequency == 0:
                agent.train_step(buffer)
                updates += 1
                if updates % 25 == 0:
                    s = agent.stats
                    print(f"update {updates:5d}  q_loss {s['q_loss']:.4f}  v_loss {s['v_loss']:.4f}  "
                          f"policy_loss {s['policy_loss']:.4f}  entropy {s['entropy']:.3f}  "
                          f"temperature {agent.temperature:.4f}")
        print(f"episode {episode:3d}  return {ret:9.2f}  updates {updates}")


if __name__ == "__main__":
    main()
