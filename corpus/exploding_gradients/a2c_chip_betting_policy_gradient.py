"""Batch A2C policy-gradient agent (OpenSpiel-style) on a two-street chip betting game.

The agent is dealt a private hand strength, sees a noisy board update on the turn and
can fold, call, raise or shove on each street against a fixed-strategy house player.
Payoffs are in chips; like many card rooms the game pays a progressive bad-beat
jackpot when a premium hand loses a showdown badly. The agent keeps whole episodes, builds Monte-Carlo returns and
alternates critic (baseline) updates with policy updates, as in
open_spiel.python.algorithms.policy_gradient.
"""
import argparse
import collections

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

Transition = collections.namedtuple("Transition", "info_state action reward")

FOLD, CALL, RAISE, SHOVE = range(4)
ACTION_NAMES = ["fold", "call", "raise", "shove"]


class ChipBettingGame:
    """Heads-up, two betting streets, 1-chip ante, raise = 8 chips, shove = whole stack."""

    def __init__(self, stack=150, bad_beat_jackpot=100000, seed=0):
        self.stack = stack
        self.bad_beat_jackpot = bad_beat_jackpot
        self.rng = np.random.default_rng(seed)
        self.info_state_size = 7
        self.num_actions = 4

    def reset(self):
        self.hand = self.rng.uniform()
        self.house = self.rng.uniform()
        self.board = 0.0
        self.street = 0
        self.invested = 1.0
        return self._obs()

    def _obs(self):
        street = np.eye(2)[self.street]
        return np.array([self.hand, self.board, self.hand + self.board,
                         self.invested / self.stack, self.stack / 100.0, *street],
                        dtype=np.float32)

    def _showdown(self):
        me = self.hand + self.board
        them = self.house + 0.3 * self.rng.normal()
        if me > them:
            return self.invested
        if self.hand > 0.97 and them > me + 0.3:
            return self.bad_beat_jackpot - self.invested
        return -self.invested

    def step(self, action):
        """Returns (next_obs, reward, done)."""
        if action == FOLD:
            return None, -self.invested, True
        if action == RAISE:
            self.invested = min(self.stack, self.invested + 8.0)
        elif action == SHOVE:
            self.invested = float(self.stack)
        if self.street == 1 or self.invested >= self.stack:
            return None, self._showdown(), True
        self.street = 1
        self.board = 0.4 * self.rng.normal()
        return self._obs(), 0.0, False


class MLPTorso(nn.Module):
    def __init__(self, input_size, hidden_sizes):
        super().__init__()
        layers, d = [], input_size
        for h in hidden_sizes:
            layers += [nn.Linear(d, h), nn.ReLU()]
            d = h
        self.net = nn.Sequential(*layers)
        self.out_size = d

    def forward(self, x):
        return self.net(x)


class PolicyGradient:
    def __init__(self, info_state_size, num_actions, hidden_layers_sizes=(64, 64),
                 batch_size=16, critic_learning_rate=0.01, pi_learning_rate=0.001,
                 entropy_cost=0.01, num_critic_before_pi=8,
                 max_global_gradient_norm=None):
        self.num_actions = num_actions
        self.batch_size = batch_size
        self.entropy_cost = entropy_cost
        self.num_critic_before_pi = num_critic_before_pi
        self.max_global_gradient_norm = max_global_gradient_norm

        self.torso = MLPTorso(info_state_size, hidden_layers_sizes)
        self.policy_logits_layer = nn.Linear(self.torso.out_size, num_actions)
        self.baseline_layer = nn.Linear(self.torso.out_size, 1)
        self.critic_network = nn.Sequential(self.torso, self.baseline_layer)
        self.pi_network = nn.Sequential(self.torso, self.policy_logits_layer)
        self.critic_optimizer = torch.optim.SGD(self.critic_network.parameters(),
                                                lr=critic_learning_rate)
        self.pi_optimizer = torch.optim.SGD(self.pi_network.parameters(),
                                            lr=pi_learning_rate)

        self.episode_data = []
        self.dataset = collections.defaultdict(list)
        self.episode_counter = 0
        self.num_learn_steps = 0
        self.last_critic_loss = None
        self.last_pi_loss = None

    def act(self, info_state):
        with torch.no_grad():
            logits = self.pi_network(torch.as_tensor(info_state)[None])
            probs = F.softmax(logits, dim=-1)[0].numpy().astype(np.float64)
        probs /= probs.sum()
        return int(np.random.choice(self.num_actions, p=probs)), probs

    def observe(self, info_state, action, reward, done):
        """Stores the transition; returns True when a learning step was taken."""
        self.episode_data.append(Transition(info_state, action, reward))
        if not done:
            return False
        rewards = [t.reward for t in self.episode_data]
        returns = np.array(rewards, dtype=np.float32)
        for i in reversed(range(len(rewards) - 1)):
            returns[i] = rewards[i] + returns[i + 1]
        self.dataset["info_states"].extend(t.info_state for t in self.episode_data)
        self.dataset["actions"].extend(t.action for t in self.episode_data)
        self.dataset["returns"].extend(returns.tolist())
        self.episode_data = []
        self.episode_counter += 1
        if self.episode_counter % self.batch_size == 0:
            self.last_critic_loss = self._critic_update()
            self.num_learn_steps += 1
            if self.num_learn_steps % self.num_critic_before_pi == 0:
                self.last_pi_loss = self._pi_update()
            self.dataset = collections.defaultdict(list)
            return True
        return False

    def _minimize(self, network, optimizer, loss):
        optimizer.zero_grad()
        loss.backward()
        if self.max_global_gradient_norm is not None:
            nn.utils.clip_grad_norm_(network.parameters(), self.max_global_gradient_norm)
        optimizer.step()

    def _batch(self):
        info_state = torch.as_tensor(np.stack(self.dataset["info_states"]))
        action = torch.as_tensor(self.dataset["actions"], dtype=torch.long)
        return_ = torch.as_tensor(self.dataset["returns"], dtype=torch.float32)
        return info_state, action, return_

    def _critic_update(self):
        info_state, _, return_ = self._batch()
        baseline = self.critic_network(info_state).squeeze(1)
        critic_loss = F.mse_loss(baseline, return_)
        self._minimize(self.critic_network, self.critic_optimizer, critic_loss)
        return critic_loss.item()

    def _pi_update(self):
        info_state, action, return_ = self._batch()
        torso_out = self.torso(info_state)
        logits = self.policy_logits_layer(torso_out)
        baseline = self.baseline_layer(torso_out).squeeze(1).detach()
        log_probs = F.log_softmax(logits, dim=-1)
        advantages = return_ - baseline
        chosen = log_probs.gather(1, action[:, None]).squeeze(1)
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        pi_loss = -(chosen * advantages).mean() - self.entropy_cost * entropy
        self._minimize(self.pi_network, self.pi_optimizer, pi_loss)
        return pi_loss.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--num_episodes", type=int, default=4000)
    parser.add_argument("--stack", type=int, default=150)
    parser.add_argument("--jackpot", type=int, default=100000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    game = ChipBettingGame(stack=args.stack, bad_beat_jackpot=args.jackpot, seed=args.seed)
    agent = PolicyGradient(game.info_state_size, game.num_actions)

    window = collections.deque(maxlen=agent.batch_size)
    for ep in range(1, args.num_episodes + 1):
        obs, done = game.reset(), False
        while not done:
            action, probs = agent.act(obs)
            next_obs, reward, done = game.step(action)
            learned = agent.observe(obs, action, reward, done)
            obs = next_obs
        window.append(reward)
        if learned:
            pi = "-" if agent.last_pi_loss is None else f"{agent.last_pi_loss:.4g}"
            print(f"ep {ep:5d} step {agent.num_learn_steps:4d} | avg chips {np.mean(window):9.2f} "
                  f"| critic {agent.last_critic_loss:.4g} | pi {pi} "
                  f"| p(fold/call/raise/shove) {np.round(probs, 2).tolist()}")


if __name__ == "__main__":
    main()
