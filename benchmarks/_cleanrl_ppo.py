"""A CleanRL-style PPO on MinAtar Breakout, in one file: the torch peer of ``benchmarks/learner_peers.py``.

Written after CleanRL's ``ppo_atari.py`` (one ``Agent`` with a shared trunk and two heads, a rollout loop into
preallocated ``[T, N]`` storage, GAE bootstrapped from the last observation, ``n_epochs`` passes of shuffled
minibatches, advantages standardised per minibatch, the global gradient norm clipped, Adam with ``eps=1e-5``), with
the MinAtar CNN (conv 16x3x3, linear 128, as rlstruct's) and the ``ppo-minatar-5m`` preset's hyperparameters. The
env source is rlstruct's torch ``MinAtarEnv`` (the compiled CPU step, sticky actions 0.1), the same as rlstruct's
runs, so that the env's speed does not decide the comparison. As in CleanRL, an episode's end (terminated or
truncated) cuts the bootstrap, and the value loss is not clipped (rlstruct's ``value_clip=0``).

Usage::

    python benchmarks/_cleanrl_ppo.py --iterations 3 --warmup 1 --threads 1
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical


@dataclass
class Args:
    """The ``ppo-minatar-5m`` preset's settings."""

    n_envs: int = 64
    n_steps: int = 128
    n_epochs: int = 4
    n_minibatches: int = 8
    lr: float = 5e-4
    gamma: float = 0.999
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    sticky_action_prob: float = 0.1
    max_episode_steps: int = 10_000
    seed: int = 0


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, in_channels: int, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(in_channels, 16, 3, stride=1)), nn.ReLU(), nn.Flatten(),
            layer_init(nn.Linear(16 * 8 * 8, 128)), nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(128, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(128, 1), std=1)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        # frames bool [N, 10, 10, C] -> float NCHW
        return self.network(x.permute(0, 3, 1, 2).float())

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(self.hidden(x))

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        hidden = self.hidden(x)
        probs = Categorical(logits=self.actor(hidden))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(hidden)


def train(iterations: int, warmup: int = 1, threads: int = 1, args: Args | None = None, *,
          bf16: bool = False) -> dict:
    """Trains ``warmup + iterations`` PPO iterations and returns the timed ones' env steps/s (learning included),
    the process CPU seconds per wall second over them, and the warm-up's seconds (start-up apart). With ``bf16`` the
    network's forwards (the rollout's and the minibatches') run under ``torch.autocast`` in bfloat16, as rlstruct's
    ``--autocast bfloat16`` does: what the same switch gives this peer (CleanRL's scripts have none)."""
    from rlstruct.envs.minatar import MinAtarEnv
    from rlstruct.structures import DictTensor

    args = args or Args()
    torch.set_num_threads(threads)
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    envs = MinAtarEnv("Breakout", args.n_envs, seed=args.seed, autoreset=True,
                      sticky_action_prob=args.sticky_action_prob, max_episode_steps=args.max_episode_steps)
    n_actions = envs.action_space.n
    agent = Agent(envs.observation_space.shape[-1], n_actions)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)
    batch_size = args.n_envs * args.n_steps
    minibatch_size = batch_size // args.n_minibatches

    obs = torch.zeros((args.n_steps, args.n_envs, *envs.observation_space.shape), dtype=torch.bool)
    actions = torch.zeros((args.n_steps, args.n_envs), dtype=torch.int64)
    logprobs = torch.zeros((args.n_steps, args.n_envs))
    rewards = torch.zeros((args.n_steps, args.n_envs))
    dones = torch.zeros((args.n_steps, args.n_envs))
    values = torch.zeros((args.n_steps, args.n_envs))

    first, _ = envs.reset()
    next_obs = first["frame"]
    next_done = torch.zeros(args.n_envs)
    t0 = c0 = None
    for iteration in range(warmup + iterations):
        if iteration == warmup:
            t0, c0 = time.perf_counter(), time.process_time()
            warmup_s = t0 - t_start
        for step in range(args.n_steps):
            obs[step] = next_obs
            dones[step] = next_done
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob
            (nxt, _), (running, _) = envs.step(DictTensor({"action": action}))
            rewards[step] = nxt["reward"]
            next_obs, next_done = running["frame"], nxt["done"].float()

        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            next_value = agent.get_value(next_obs).reshape(1, -1).float()
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(args.n_steps)):
                if t == args.n_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
            returns = advantages + values

        b_obs = obs.reshape((-1, *envs.observation_space.shape))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)

        b_inds = np.arange(batch_size)
        for _ in range(args.n_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, batch_size, minibatch_size):
                mb_inds = b_inds[start:start + minibatch_size]
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                newlogprob, entropy, newvalue = newlogprob.float(), entropy.float(), newvalue.float()
                ratio = (newlogprob - b_logprobs[mb_inds]).exp()
                mb_advantages = b_advantages[mb_inds]
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                pg_loss = torch.max(-mb_advantages * ratio,
                                    -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()
                v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb_inds]) ** 2).mean()
                loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
    wall = time.perf_counter() - t0
    return {"steps_per_s": iterations * batch_size / wall, "cores": (time.process_time() - c0) / wall,
            "warmup_s": warmup_s}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bf16", action="store_true", help="the forwards under bfloat16 autocast")
    cli = parser.parse_args()
    print(json.dumps(train(cli.iterations, cli.warmup, cli.threads, bf16=cli.bf16)))
