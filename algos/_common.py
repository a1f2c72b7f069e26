"""What every algorithm shares: numerics, networks, the policy agent, configs, logging, evaluation, checkpoints.

The numerics (discounted returns, GAE, n-step returns, double-DQN targets, episode statistics) are free
functions on ``[B, T]`` tensors, written over whole batches (the only Python loops run over time or over
the n of n-step returns), and tested against plain Python loops in ``tests/test_algos_losses.py``.

The infrastructure (:class:`RunConfig`, :class:`Run`, :class:`Evaluator`, :class:`TrainResult`,
checkpoints, the learning-curve plot, the argument parser built from a config dataclass) keeps the
algorithm files short: each of ``reinforce.py``, ``a2c.py`` and ``dqn.py`` holds a config, a loss and a
training loop.

Convention for the time axis: step ``t`` of a trajectory is the transition
``observation/* (t) --action (t)--> _observation/* (t)``; the reward, ``done``, ``terminated`` and
``truncated`` of that transition are the ``_observation/*`` ones.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import logging
import math
import os
import re
import sys
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice
from rlstruct.batchers import RL_Batcher
from rlstruct.devices import DeviceLike, as_device, check_device_exists
from rlstruct.envs import make_env
from rlstruct.envs.factory import BACKENDS
from rlstruct.errors import DeviceMismatchError, RLStructError
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories

__all__ = [
    "discounted_returns",
    "gae_advantages",
    "n_step_returns",
    "double_dqn_targets",
    "episode_statistics",
    "episode_returns",
    "mlp",
    "ActorCritic",
    "PolicyAgent",
    "create_policy_agent",
    "create_env",
    "EnvSpec",
    "describe_env",
    "RunConfig",
    "validate_run_config",
    "worker_seeds",
    "TrainResult",
    "Run",
    "Evaluator",
    "cpu_state_dict",
    "make_adam",
    "check_on_device",
    "save_checkpoint",
    "load_checkpoint",
    "plot_learning_curve",
    "field_docs",
    "build_parser",
    "config_from_args",
    "run_main",
]

log = logging.getLogger(__name__)


# =============================================================================================== numerics
def _as_float(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.to(like.dtype) if x.dtype != like.dtype else x


def discounted_returns(
    rewards: torch.Tensor, done: torch.Tensor, gamma: float, *, bootstrap: torch.Tensor | None = None
) -> torch.Tensor:
    """Discounted returns computed backwards in time, cut at episode ends.

    ``G_t = r_t + gamma * ((1 - done_t) * G_{t+1} + bootstrap_t)`` with ``G_T = 0``. Set
    ``bootstrap_t = V(s_{t+1})`` where an episode is cut without terminating (a truncation, or the
    last step of an unfinished row) and ``0`` elsewhere.

    Args:
        rewards: ``float [B, T]``; padding steps must be zero, or cut off by ``done`` at the last valid step.
        done: ``bool or float [B, T]``, the episode ended at step ``t`` (terminated or truncated).
        gamma: discount factor.
        bootstrap: ``float [B, T]`` or ``None`` (no bootstrap).

    Returns:
        ``float [B, T]``, the returns.

    >>> discounted_returns(torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[False, True, False]]), 0.5)
    tensor([[1.5000, 1.0000, 1.0000]])
    """
    not_done = 1.0 - _as_float(done, rewards)
    returns = torch.empty_like(rewards)
    g = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        nxt = not_done[:, t] * g
        if bootstrap is not None:
            nxt = nxt + bootstrap[:, t]
        g = rewards[:, t] + gamma * nxt
        returns[:, t] = g
    return returns


def gae_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) with the time-limit rule.

    ``delta_t = r_t + gamma * (1 - terminated_t) * V'_t - V_t`` where ``V'_t`` is the value of the
    observation reached at ``t`` (``_observation/frame``, before any auto-reset): a truncated step
    bootstraps from its terminal observation, a terminated step does not bootstrap. The recursion
    ``A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}`` (``A_T = 0``) is cut at every episode end,
    so the last step of a row bootstraps from ``V'_{T-1}`` alone.

    Args:
        rewards: ``float [B, T]``.
        values: ``float [B, T]``, ``V(observation/frame)`` (no gradient needed).
        next_values: ``float [B, T]``, ``V(_observation/frame)``.
        terminated: ``bool [B, T]``.
        done: ``bool [B, T]`` (terminated or truncated).
        gamma: discount factor.
        lam: GAE lambda (1: Monte-Carlo advantages bootstrapped at the row's end; 0: one-step TD errors).

    Returns:
        ``float [B, T]``, the advantages; the critic's targets are ``advantages + values``.

    >>> r = torch.ones(1, 2); v = torch.zeros(1, 2); nv = torch.full((1, 2), 10.0)
    >>> f = torch.tensor([[False, False]]); trunc = torch.tensor([[False, True]])
    >>> gae_advantages(r, v, nv, f, trunc, gamma=0.5, lam=1.0)
    tensor([[9., 6.]])
    """
    not_term = 1.0 - _as_float(terminated, rewards)
    not_done = 1.0 - _as_float(done, rewards)
    deltas = rewards + gamma * not_term * next_values - values
    advantages = torch.empty_like(rewards)
    a = torch.zeros_like(rewards[:, 0])
    c = gamma * lam
    for t in range(rewards.shape[1] - 1, -1, -1):
        a = deltas[:, t] + c * not_done[:, t] * a
        advantages[:, t] = a
    return advantages


def n_step_returns(
    rewards: torch.Tensor, done: torch.Tensor, terminated: torch.Tensor, gamma: float, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n-step returns of every step that has ``n`` steps after it in the window, cut at episode ends.

    For ``t`` in ``[0, M)``, ``M = L - n + 1``, the transition starting at ``t`` sums the rewards of
    ``m = min(n, steps up to and including the episode's end)`` steps:
    ``R_t = sum_{k<m} gamma^k r_{t+k}``; it ends at ``last_t = t + m - 1`` and its target is
    ``R_t + discount_t * Q(_observation/frame at last_t, .)`` with
    ``discount_t = gamma^m * (1 - terminated_{last_t})``: a truncated end bootstraps from the
    terminal observation, a terminated one does not.

    Args:
        rewards: ``float [B, L]``.
        done: ``bool [B, L]``.
        terminated: ``bool [B, L]``.
        gamma: discount factor.
        n: steps per return (``1 <= n <= L``).

    Returns:
        ``(returns float [B, M], last int64 [B, M], discounts float [B, M])``.

    Raises:
        ValueError: ``n`` is not in ``[1, L]``.

    >>> r = torch.ones(1, 3); truncated = torch.tensor([[False, True, False]])
    >>> R, last, disc = n_step_returns(r, truncated, torch.zeros_like(truncated), 0.5, 2)
    >>> R.tolist(), last.tolist(), disc.tolist()
    ([[1.5, 1.0]], [[1, 1]], [[0.25, 0.5]])
    """
    B, L = rewards.shape
    if not 1 <= n <= L:
        raise ValueError(f"n must be in [1, L={L}] (the window length), got {n}")
    M = L - n + 1
    dev = rewards.device
    base = torch.arange(M, device=dev).expand(B, M)
    returns = torch.zeros(B, M, dtype=rewards.dtype, device=dev)
    alive = torch.ones(B, M, dtype=torch.bool, device=dev)
    steps = torch.zeros(B, M, dtype=torch.int64, device=dev)
    term_end = torch.zeros(B, M, dtype=torch.bool, device=dev)
    for k in range(n):
        returns = returns + alive * (gamma**k) * rewards[:, k : k + M]
        steps = torch.where(alive, k + 1, steps)
        term_end = torch.where(alive, terminated[:, k : k + M].bool(), term_end)
        alive = alive & ~done[:, k : k + M].bool()
    discounts = torch.pow(torch.tensor(gamma, dtype=rewards.dtype, device=dev), steps) * (~term_end)
    return returns, base + steps - 1, discounts


def double_dqn_targets(
    returns: torch.Tensor, discounts: torch.Tensor, next_q_online: torch.Tensor, next_q_target: torch.Tensor
) -> torch.Tensor:
    """Double-DQN targets (van Hasselt et al. 2016): the online net picks, the target net evaluates.

    ``y = R + discount * Q_target(s', argmax_a Q_online(s', a))``.

    Args:
        returns: ``float [N]`` (n-step) rewards.
        discounts: ``float [N]``, ``gamma^m`` or 0 where the episode terminated.
        next_q_online: ``float [N, A]``.
        next_q_target: ``float [N, A]``.

    Returns:
        ``float [N]``, the targets (no gradient flows through them if the inputs carry none).

    >>> double_dqn_targets(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([[0.0, 1.0]]),
    ...                    torch.tensor([[8.0, 2.0]]))
    tensor([2.])
    """
    a_star = next_q_online.argmax(-1, keepdim=True)
    return returns + discounts * next_q_target.gather(-1, a_star).squeeze(-1)


def episode_statistics(
    rewards: torch.Tensor, done: torch.Tensor, carry_return: torch.Tensor, carry_length: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns and lengths of the episodes that end in a window of auto-reset rows, without a loop.

    Each row's steps are binned by episode (the number of ends before them); bin 0 continues the
    episode carried over from the previous window.

    Args:
        rewards: ``float [B, T]``.
        done: ``bool [B, T]``.
        carry_return: ``float [B]``, return so far of each row's unfinished episode.
        carry_length: ``int64 [B]``, its length so far.

    Returns:
        ``(return_sum, length_sum, count, carry_return, carry_length)``: the sums over the episodes
        that ended in the window (0-d tensors), how many ended, and the new carries.

    >>> s = episode_statistics(torch.ones(1, 3), torch.tensor([[False, True, False]]), torch.tensor([5.0]),
    ...                        torch.tensor([5]))
    >>> [x.tolist() for x in s]
    [7.0, 7, 1, [1.0], [1]]
    """
    B, T = rewards.shape
    d = done.long()
    episode = torch.cumsum(d, 1) - d
    bins = torch.zeros(B, T + 1, dtype=rewards.dtype, device=rewards.device)
    bins.scatter_add_(1, episode, rewards)
    bins[:, 0] += carry_return
    lengths = torch.zeros(B, T + 1, dtype=torch.int64, device=rewards.device)
    lengths.scatter_add_(1, episode, torch.ones_like(episode))
    lengths[:, 0] += carry_length
    n_done = d.sum(1, keepdim=True)
    completed = torch.arange(T + 1, device=rewards.device).unsqueeze(0) < n_done
    return (
        (bins * completed).sum(),
        (lengths * completed).sum(),
        n_done.sum(),
        bins.gather(1, n_done).squeeze(1),
        lengths.gather(1, n_done).squeeze(1),
    )


def episode_returns(trajectories: Trajectories) -> tuple[torch.Tensor, torch.Tensor]:
    """Undiscounted return and length of each row of complete episodes (an episodic batcher's output).

    Returns:
        ``(returns float [B], lengths int64 [B])`` on the trajectories' device.
    """
    tt = trajectories.trajectories
    return (tt["_observation/reward"] * tt.mask()).sum(1), tt.lengths


def masked_policy_value_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    values: torch.Tensor,
    value_targets: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    value_coef: float,
    entropy_coef: float,
    normalize_advantages: bool,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy-gradient loss of a categorical policy with a learned value, averaged over the valid steps.

    ``loss = -mean(log pi(a|s) * A) + value_coef * mean((V(s) - target)^2) / 2 - entropy_coef * mean(H)``:
    the core of :func:`~rlstruct.algos.a2c.a2c_loss` (GAE targets) and
    :func:`~rlstruct.algos.reinforce.reinforce_loss` (Monte-Carlo returns, ``V`` the baseline), which
    compute their own ``value_targets`` and ``advantages``.

    Args:
        logits: ``float [B, T, A]`` with gradient.
        actions: ``int64 [B, T]``.
        values: ``float [B, T]`` with gradient.
        value_targets: ``float [B, T]``, what ``values`` regresses on (no gradient).
        advantages: ``float [B, T]`` (no gradient).
        mask: ``float [B, T]``, 1 on valid steps; an all-zero mask gives a zero loss, not nan.
        value_coef: weight of the value loss.
        entropy_coef: weight of the entropy bonus.
        normalize_advantages: standardise the advantages over the valid steps for the policy term.

    Returns:
        ``(loss, stats)``: the scalar loss and detached 0-d ``policy``, ``value`` and ``entropy`` terms.

    >>> loss, stats = masked_policy_value_loss(torch.zeros(1, 2, 2), torch.zeros(1, 2, dtype=torch.long),
    ...                                        torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), torch.ones(1, 2),
    ...                                        value_coef=1.0, entropy_coef=0.0, normalize_advantages=False)
    >>> round(loss.item(), 4), round(stats["value"].item(), 4)
    (1.1931, 0.5)
    """
    n = mask.sum().clamp_min(1.0)
    log_probs = torch.log_softmax(logits, -1)
    log_pi = log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    adv = advantages
    if normalize_advantages:
        mean = (adv * mask).sum() / n
        std = (((adv - mean) ** 2 * mask).sum() / n).sqrt()
        adv = (adv - mean) / (std + 1e-8)
    policy_loss = -(log_pi * adv * mask).sum() / n
    value_loss = 0.5 * (((values - value_targets) ** 2) * mask).sum() / n
    mean_entropy = (entropy * mask).sum() / n
    loss = policy_loss + value_coef * value_loss - entropy_coef * mean_entropy
    return loss, {"policy": policy_loss.detach(), "value": value_loss.detach(), "entropy": mean_entropy.detach()}


# =============================================================================================== networks
def mlp(in_size: int, hidden_sizes: Sequence[int], out_size: int, *, out_gain: float = 1.0) -> nn.Sequential:
    """A tanh MLP with orthogonal initialisation (gain sqrt(2) inside, ``out_gain`` on the last layer).

    >>> mlp(4, (8,), 2)(torch.zeros(3, 4)).shape
    torch.Size([3, 2])
    """
    layers: list[nn.Module] = []
    sizes = [in_size, *hidden_sizes]
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [_init(nn.Linear(a, b), math.sqrt(2)), nn.Tanh()]
    layers.append(_init(nn.Linear(sizes[-1], out_size), out_gain))
    return nn.Sequential(*layers)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    """Separate policy and value MLPs over a flat observation.

    Args:
        obs_dim: observation size.
        n_actions: number of discrete actions.
        hidden_sizes: hidden widths of both MLPs.

    >>> m = ActorCritic(4, 2, (8,))
    >>> m.policy(torch.zeros(3, 4)).shape, m.value(torch.zeros(3, 4)).shape
    (torch.Size([3, 2]), torch.Size([3]))
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int]):
        super().__init__()
        self.actor = mlp(obs_dim, hidden_sizes, n_actions, out_gain=0.01)
        self.critic = mlp(obs_dim, hidden_sizes, 1, out_gain=1.0)

    def policy(self, frame: torch.Tensor) -> torch.Tensor:
        """Action logits ``[N, n_actions]`` of observations ``[N, obs_dim]``."""
        return self.actor(frame)

    def value(self, frame: torch.Tensor) -> torch.Tensor:
        """State values ``[N]``."""
        return self.critic(frame).squeeze(-1)


def _sample_categorical(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # Gumbel-max: one uniform draw per logit, no per-row branch, works on every device with a generator.
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    return (logits - torch.log(-torch.log(u.clamp_min(1e-20)))).argmax(-1)


class NetworkAgent(RL_Agent):
    """The part every batcher agent of ``algos`` shares: one network on ``device`` and its own generator.

    The generator is seeded by the batcher's ``agent_seeds``; :meth:`update` loads the learner's weights;
    :meth:`_on_device` copies a per-env ``agent_info`` tensor to the device once per acquisition.

    Args:
        model: the network, on ``device``.
        device: where observations come from and actions go.
    """

    def __init__(self, model: nn.Module, device: DeviceLike):
        self.model = model
        self.device = as_device(device)
        self.generator = torch.Generator(device=self.device)
        self._info: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def update(self, state_dict: Any) -> None:
        self.model.load_state_dict(state_dict)

    def _on_device(self, info: torch.Tensor) -> torch.Tensor:
        # The batcher hands the same CPU tensor at every step of an acquisition: copy it to the device once.
        if self._info[0] is not info:
            self._info = (info, info.to(self.device))
        return self._info[1]


class PolicyAgent(NetworkAgent):
    """A stateless categorical policy for the batchers, and the learner's replay of its network.

    ``__call__`` samples an action where ``agent_info["stochastic"]`` is true (every row when the key is
    missing) and takes the most likely action elsewhere. :meth:`replay_batch` recomputes, for a whole
    batch of trajectories at once (one forward over ``B*T`` rows), the logits, ``V(observation/frame)``
    and ``V(_observation/frame)``; :meth:`call_replay` computes the same for one step, for
    :func:`rlstruct.agents.replay_agent`.

    Args:
        model: the :class:`ActorCritic`, on ``device``.
        device: where observations come from and actions go.
    """

    model: ActorCritic

    def _stochastic(self, agent_info: DictTensor) -> torch.Tensor | None:
        if "stochastic" not in agent_info:
            return None
        return self._on_device(agent_info["stochastic"])

    def __call__(self, state, observation, agent_info, history=None):
        logits = self.model.policy(observation["frame"])
        action = _sample_categorical(logits, self.generator)
        stochastic = self._stochastic(agent_info)
        if stochastic is not None:
            action = torch.where(stochastic, action, logits.argmax(-1))
        return DictTensor({"action": action}), state

    def _outputs(self, frame: torch.Tensor, next_frame: torch.Tensor) -> dict[str, torch.Tensor]:
        n = frame.shape[0]
        values = self.model.value(torch.cat([frame, next_frame]))
        return {"logits": self.model.policy(frame), "value": values[:n], "next_value": values[n:]}

    def call_replay(self, trajectories: Trajectories, t: int, state: DictTensor | None):
        tt = trajectories.trajectories
        out = self._outputs(tt["observation/frame"][:, t], tt["_observation/frame"][:, t])
        return DictTensor(out), DictTensor({})

    def replay_batch(self, trajectories: Trajectories) -> TemporalDictTensor:
        """``logits [B, T, A]``, ``value [B, T]`` and ``next_value [B, T]`` in one forward pass."""
        tt = trajectories.trajectories
        obs, nxt = tt["observation/frame"], tt["_observation/frame"]
        B, T = obs.shape[:2]
        out = self._outputs(obs.flatten(0, 1), nxt.flatten(0, 1))
        return TemporalDictTensor({k: v.unflatten(0, (B, T)) for k, v in out.items()}, tt.lengths)


def create_policy_agent(
    obs_dim: int, n_actions: int, hidden_sizes: Sequence[int], device: str = "cpu", check_device: bool = False
) -> RL_Agent:
    """Builds a batcher's :class:`PolicyAgent` on ``device`` (a module-level function, so it pickles).

    Its weights are random until the first ``batcher.update``. With ``check_device`` it is wrapped in
    :class:`~rlstruct.agents.RL_Agent_CheckDevice`.
    """
    model = ActorCritic(obs_dim, n_actions, hidden_sizes).to(device)
    model.requires_grad_(False)
    agent: RL_Agent = PolicyAgent(model, device)
    return RL_Agent_CheckDevice(agent, device) if check_device else agent


def make_adam(model: nn.Module, lr: float, device: DeviceLike) -> torch.optim.Adam:
    """Adam over the model's parameters; the fused kernel where torch has one (CPU, CUDA).

    Note that the first optimizer of a process imports ``torch._dynamo`` (about 2 s on a small CPU).
    """
    fused = as_device(device).type in ("cpu", "cuda")
    return torch.optim.Adam(model.parameters(), lr=lr, fused=fused or None)


def cpu_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the model's weights on the CPU (what :meth:`RL_Batcher.update` takes).

    Always a copy, also for a CPU model (where ``.cpu()`` would alias the live parameters): the
    evaluator keeps the weights it evaluated while training goes on.
    """
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def check_on_device(structure: Trajectories | nn.Module, device: DeviceLike, what: str) -> None:
    """Raises :class:`DeviceMismatchError` when a tensor of ``structure`` is not on ``device``.

    Used by the learners with ``check_devices=True`` for what :class:`RL_Agent_CheckDevice` does not see
    (the model's parameters, a replay buffer's input).
    """
    d = as_device(device)
    if isinstance(structure, nn.Module):
        items = list(structure.named_parameters()) + list(structure.named_buffers())
    else:
        items = [*structure.info.items(), *structure.trajectories.items(), ("lengths", structure.trajectories.lengths)]
    for k, v in items:
        if v.device != d:
            raise DeviceMismatchError(
                f"{what} must be on {d}, got {v.device} (key {k!r}); move it with .to({str(d)!r})"
            )


# =============================================================================================== envs
def create_env(
    name: str,
    n_envs: int,
    *,
    seed: int,
    device: str = "cpu",
    autoreset: bool = False,
    backend: str = "torch",
    max_episode_steps: int | None = None,
):
    """The batchers' ``create_env``: :func:`rlstruct.envs.make_env` with keyword arguments (pickles)."""
    return make_env(
        name, n_envs, device=device, seed=seed, autoreset=autoreset, backend=backend,
        max_episode_steps=max_episode_steps,
    )


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What the learner needs to know about an env to build its networks.

    Attributes:
        obs_dim: size of the flat observation ``frame``.
        n_actions: number of discrete actions.
        max_episode_steps: the episode time limit.
        reward_threshold: gymnasium's "solved" return for the id (475 for CartPole-v1), or None.
    """

    obs_dim: int
    n_actions: int
    max_episode_steps: int
    reward_threshold: float | None = None


def describe_env(name: str, backend: str, max_episode_steps: int | None) -> EnvSpec:
    """Builds one CPU env of ``name`` to read its spaces and time limit.

    Raises:
        ValueError: the action space is not discrete, the observation is not a flat box, or the env has
            no time limit and ``max_episode_steps`` is ``None``.
    """
    env = make_env(name, 1, backend=backend, max_episode_steps=max_episode_steps)
    try:
        act, obs = env.action_space, env.observation_space
        limit = max_episode_steps
        if limit is None:
            limit = getattr(env, "max_episode_steps", None)
        if limit is None and backend != "torch":
            limit = gym.spec(name).max_episode_steps
    finally:
        env.close()
    if not isinstance(act, gym.spaces.Discrete):
        raise ValueError(f"env={name!r} has action space {act}; the algorithms here take discrete actions only")
    if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
        raise ValueError(f"env={name!r} has observation space {obs}; the algorithms here take a flat Box")
    if limit is None:
        raise ValueError(f"env={name!r} has no time limit; pass max_episode_steps (--max-episode-steps)")
    try:
        threshold = gym.spec(name).reward_threshold
    except gym.error.Error:
        threshold = None
    return EnvSpec(int(obs.shape[0]), int(act.n), int(limit), None if threshold is None else float(threshold))


# =============================================================================================== config
@dataclasses.dataclass
class RunConfig:
    """Settings every algorithm shares: environment, devices, budget, evaluation and logging.

    Attributes:
        env: gymnasium id of the environment, e.g. CartPole-v1 or Acrobot-v1.
        backend: torch (rlstruct's torch simulators), gymnasium or envpool.
        n_envs: environments per training worker (the batch is n_envs * max(n_processes, 1) envs).
        n_processes: training batcher worker processes (0 steps the envs in this process).
        max_episode_steps: episode time limit (truncation); None keeps the env's own.
        learner_device: where the model, the loss and the optimizer (and a replay buffer) live.
        batcher_device: where the training batcher's envs, agents and buffer live.
        evaluation_device: where the evaluation batcher's envs, agent and buffer live.
        seed: seeds the networks, the envs and the agents.
        time_limit: stop training after this many seconds of wall clock (setup included).
        max_env_steps: stop training after this many training env steps (None: no limit).
        target_return: stop once an evaluation of trained weights reaches this mean return, and keep those weights.
        stop_at_reward_threshold: without target_return, use the env's gymnasium reward_threshold (CartPole-v1: 475).
        hidden_sizes: hidden layer widths of the networks.
        lr: Adam learning rate.
        n_evaluation_envs: episodes per evaluation (episodic envs of the evaluation batcher).
        n_evaluation_processes: evaluation worker processes (0 evaluates in this process, pausing training).
        eval_every: training iterations at least between two evaluation launches.
        logdir: where progress.csv, TensorBoard events, the plot and the checkpoint go (None: runs/<algo>-<env>-<seed>).
        log_every: iterations between two TensorBoard and progress-bar updates (the CSV gets every one).
        progress: show a tqdm progress bar on stderr.
        tensorboard: write TensorBoard event files into logdir.
        check_devices: wrap every agent in RL_Agent_CheckDevice and replay the learner's forward through it (slow).
        torch_threads: torch intra-op threads of the learner process (0 keeps torch's default).
    """

    env: str = "CartPole-v1"
    backend: str = "torch"
    n_envs: int = 16
    n_processes: int = 0
    max_episode_steps: int | None = None
    learner_device: str = "cpu"
    batcher_device: str = "cpu"
    evaluation_device: str = "cpu"
    seed: int = 0
    time_limit: float = 60.0
    max_env_steps: int | None = None
    target_return: float | None = None
    stop_at_reward_threshold: bool = True
    hidden_sizes: tuple[int, ...] = (64, 64)
    lr: float = 1e-3
    n_evaluation_envs: int = 16
    n_evaluation_processes: int = 0
    eval_every: int = 50
    logdir: str | None = None
    log_every: int = 10
    progress: bool = True
    tensorboard: bool = True
    check_devices: bool = False
    torch_threads: int = 1

    def to_dict(self) -> dict[str, Any]:
        """The config as plain Python types (tuples become lists), for JSON and checkpoints."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def validate_run_config(config: RunConfig) -> None:
    """Checks the shared settings before anything is built.

    Raises:
        DeviceUnavailableError: a device does not exist here (the message names the devices that do).
        ValueError: a setting is out of range.
    """
    if config.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {config.backend!r}")
    for name in ("n_envs", "n_evaluation_envs", "eval_every", "log_every"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)!r}")
    for name in ("n_processes", "n_evaluation_processes", "torch_threads"):
        if getattr(config, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(config, name)!r}")
    if not config.time_limit > 0:
        raise ValueError(f"time_limit must be > 0 seconds, got {config.time_limit!r}")
    if config.max_env_steps is not None and config.max_env_steps < 1:
        raise ValueError(f"max_env_steps must be >= 1 or None, got {config.max_env_steps!r}")
    if not config.hidden_sizes or min(config.hidden_sizes) < 1:
        raise ValueError(f"hidden_sizes must be one or more positive widths, got {config.hidden_sizes!r}")
    for name in ("learner_device", "batcher_device", "evaluation_device"):
        check_device_exists(getattr(config, name), argument=name)


def worker_seeds(seed: int, n_workers: int, offset: int) -> list[int]:
    """Distinct env/agent seeds per worker, per batcher (``offset`` tells batchers apart)."""
    return [seed * 10_000 + offset + k for k in range(n_workers)]


# =============================================================================================== results
@dataclasses.dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        eval_return: mean return of the final (blocking) evaluation of the final policy.
        env_steps: training environment steps taken.
        wall_time_s: seconds from the start of ``train`` to the end of the final evaluation.
        history: one dict per training iteration (and per evaluation), as in ``progress.csv``.
        logdir: where the logs, plot and checkpoint are.
        iterations: training iterations done.
        checkpoint: path of ``checkpoint.pt``.
        plot: path of the learning-curve PNG (``None`` without matplotlib).
        target_return: the return that stops training (``target_return`` or the env's threshold), or ``None``.
        reached_target: whether an evaluation reached it (training then stopped, keeping those weights).
    """

    eval_return: float
    env_steps: int
    wall_time_s: float
    history: list[dict[str, float]]
    logdir: str
    iterations: int = 0
    checkpoint: str | None = None
    plot: str | None = None
    target_return: float | None = None
    reached_target: bool = False

    def summary(self) -> dict[str, Any]:
        """The JSON-able fields (everything but the history)."""
        return {
            "eval_return": self.eval_return,
            "env_steps": self.env_steps,
            "wall_time_s": round(self.wall_time_s, 3),
            "logdir": self.logdir,
            "iterations": self.iterations,
            "checkpoint": self.checkpoint,
            "plot": self.plot,
            "target_return": self.target_return,
            "reached_target": self.reached_target,
        }


# =============================================================================================== run bookkeeping
class Run:
    """The clock, the budget, and the logs of one training run.

    Rows are recorded once per iteration with statistics that may still be tensors on the learner device;
    every ``log_every`` iterations (and at each evaluation) they are converted together, with one host
    sync, and written to ``progress.csv`` (every row), TensorBoard (the last row of the window and every
    evaluation) and the progress bar.

    Args:
        algo: the algorithm's name.
        config: the run's config.
        spec: the env's description (for its reward threshold).
        start: ``time.perf_counter()`` when the run started (default: now).
    """

    CSV_NAME = "progress.csv"

    def __init__(self, algo: str, config: RunConfig, spec: EnvSpec, *, start: float | None = None):
        self.algo = algo
        self.config = config
        self.target_return = config.target_return
        if self.target_return is None and config.stop_at_reward_threshold:
            self.target_return = spec.reward_threshold
        self.start = time.perf_counter() if start is None else start
        self.logdir = Path(config.logdir or f"runs/{algo}-{config.env}-{config.seed}")
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.env_steps = 0
        self.iteration = 0
        self.history: list[dict[str, float]] = []
        self.last_eval: float | None = None
        self.reached_target = False
        self._pending: list[dict[str, Any]] = []
        self._csv_file = open(self.logdir / self.CSV_NAME, "w", newline="")
        self._csv_fields: list[str] = []
        self._csv: csv.DictWriter | None = None
        self._tb = self._open_tensorboard() if config.tensorboard else None
        self._bar = self._open_progress() if config.progress else None
        self._bar_steps = 0
        self._rate = (self.start, 0)
        with open(self.logdir / "config.json", "w") as f:
            json.dump({"algo": algo, **config.to_dict(), "env_spec": dataclasses.asdict(spec),
                       "effective_target_return": self.target_return}, f, indent=2)

    def _open_tensorboard(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is an optional extra
            log.warning("tensorboard is not installed (pip install 'rlstruct[tensorboard]'); not writing events")
            return None
        return SummaryWriter(str(self.logdir))

    def _open_progress(self):
        try:
            from tqdm import tqdm
        except ImportError:
            log.warning("tqdm is not installed (pip install 'rlstruct[progress]'); no progress bar")
            return None
        return tqdm(total=self.config.max_env_steps, unit="step", unit_scale=True, file=sys.stderr,
                    dynamic_ncols=True, mininterval=0.5, desc=f"{self.algo} {self.config.env}")

    # ------------------------------------------------------------------ budget
    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start

    def budget_used(self) -> float:
        """The fraction of the budget spent, in ``[0, 1]``: of ``max_env_steps`` when set, else of the time limit.

        Env steps take precedence so that a run with a step budget does not depend on the machine's speed.
        """
        if self.config.max_env_steps is not None:
            return min(self.env_steps / self.config.max_env_steps, 1.0)
        return min(self.elapsed() / self.config.time_limit, 1.0)

    def should_stop(self) -> bool:
        """True once the time limit or the env-step budget is spent, or an evaluation reached the target."""
        if self.reached_target:
            return True
        if self.config.max_env_steps is not None and self.env_steps >= self.config.max_env_steps:
            return True
        return self.elapsed() >= self.config.time_limit

    # ------------------------------------------------------------------ rows
    def record(self, env_steps: int, stats: dict[str, torch.Tensor | float]) -> None:
        """Ends one training iteration of ``env_steps`` new env steps with its statistics."""
        self.iteration += 1
        self.env_steps += env_steps
        row = {"iteration": self.iteration, "env_steps": self.env_steps, "wall_time_s": self.elapsed(), **stats}
        self._pending.append(row)
        if self.iteration % self.config.log_every == 0:
            self.flush()

    def record_eval(self, result: dict[str, float]) -> None:
        """Logs an evaluation result (its own row, at the current iteration)."""
        self.flush()
        self.last_eval = result["eval/return"]
        # The untrained network's evaluation does not count: on CartPole a random network can balance by luck.
        trained = result.get("eval/launch_env_steps", 1.0) > 0
        if self.target_return is not None and trained and self.last_eval >= self.target_return:
            self.reached_target = True
        row = {"iteration": self.iteration, "env_steps": self.env_steps, "wall_time_s": self.elapsed(), **result}
        self._write([row], tb_rows=[row])
        log.info("iteration %d, %d env steps: evaluation return %.2f", self.iteration, self.env_steps, self.last_eval)

    def poll_evaluation(self, evaluator: Evaluator, weights: Callable[[], dict]) -> None:
        """Logs the result of ``evaluator`` if one is ready (never waits); ``weights`` gives the CPU state dict
        for the next evaluation."""
        result = evaluator.poll(weights, self.iteration, self.env_steps)
        if result is not None:
            self.record_eval(result)

    def flush(self) -> None:
        """Converts the pending rows (one host sync) and writes them out."""
        if not self._pending:
            return
        rows, self._pending = self._pending, []
        tensors = [v for r in rows for v in r.values() if isinstance(v, torch.Tensor)]
        if tensors:
            values = iter(torch.stack([t.detach().float().reshape(()) for t in tensors]).tolist())
            rows = [{k: next(values) if isinstance(v, torch.Tensor) else v for k, v in r.items()} for r in rows]
        self._write(rows, tb_rows=rows[-1:])

    def _write(self, rows: list[dict[str, Any]], tb_rows: list[dict[str, Any]]) -> None:
        self.history.extend(rows)
        new = [k for r in rows for k in r if k not in self._csv_fields]
        if new or self._csv is None:
            for k in new:
                if k not in self._csv_fields:
                    self._csv_fields.append(k)
            # A new column (e.g. the first evaluation): rewrite the file with the wider header.
            self._csv_file.seek(0)
            self._csv_file.truncate()
            self._csv = csv.DictWriter(self._csv_file, fieldnames=self._csv_fields, restval="")
            self._csv.writeheader()
            self._csv.writerows(self.history)
        else:
            self._csv.writerows(rows)
        self._csv_file.flush()
        if self._tb is not None:
            for r in tb_rows:
                step = int(r["env_steps"])
                for k, v in r.items():
                    if k not in ("iteration", "env_steps") and isinstance(v, (int, float)) and math.isfinite(v):
                        self._tb.add_scalar(k, v, step)
        if self._bar is not None and self.env_steps > self._bar_steps:
            self._bar.update(self.env_steps - self._bar_steps)
            self._bar_steps = self.env_steps
            now = time.perf_counter()
            sps = (self.env_steps - self._rate[1]) / max(now - self._rate[0], 1e-9)
            self._rate = (now, self.env_steps)
            post = {"it": self.iteration, "steps/s": f"{sps:,.0f}"}
            if self.last_eval is not None:
                post["eval"] = f"{self.last_eval:.1f}"
            self._bar.set_postfix(post, refresh=False)

    def close(self) -> None:
        """Flushes and closes the CSV, TensorBoard and the progress bar; idempotent."""
        if self._csv_file.closed:
            return
        self.flush()
        self._csv_file.close()
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()


# =============================================================================================== evaluation
class Evaluator:
    """Asynchronous evaluation with an episodic batcher (rlstructures' pattern §5.9(d)).

    :meth:`poll` never blocks: it collects a finished evaluation when there is one
    (``get(blocking=False)``) and then, at most every ``every`` iterations, sends the current weights
    (``update``), restarts the episodes (``reset``) and launches the next evaluation (``execute``).
    With worker processes the evaluation runs while training goes on; in process (``n_processes=0``),
    ``execute`` runs the episodes before it returns. :meth:`final` evaluates the final weights, blocking.

    Args:
        batcher: an episodic batcher whose ``n_timesteps`` covers a whole episode.
        agent_info: the evaluation's agent_info (CPU, one row per env), e.g. ``stochastic=False``.
        every: iterations at least between two launches.
    """

    def __init__(self, batcher: RL_Batcher, agent_info: DictTensor, every: int):
        self.batcher = batcher
        self.agent_info = agent_info
        self.every = every
        self.pending = False
        self.last_launch: int | None = None
        self._launch_steps = 0
        self._launch_weights: dict[str, torch.Tensor] | None = None
        #: the weights of the last evaluation collected (what its result is about)
        self.evaluated_weights: dict[str, torch.Tensor] | None = None

    def launch(self, weights: dict[str, torch.Tensor], iteration: int, env_steps: int) -> None:
        """Sends ``weights`` and starts an evaluation of ``batcher.n_elems()`` episodes."""
        self.batcher.update(weights)
        self.batcher.reset(agent_info=self.agent_info)
        self.batcher.execute()
        self.pending = True
        self.last_launch = iteration
        self._launch_steps = env_steps
        self._launch_weights = weights

    def poll(
        self, weights: Callable[[], dict[str, torch.Tensor]], iteration: int, env_steps: int
    ) -> dict[str, float] | None:
        """Collects a finished evaluation (or ``None``) and launches the next one when it is time.

        Args:
            weights: called only when a launch happens (so that the CPU copy is made only then).
            iteration: the current training iteration.
            env_steps: the current training env steps.
        """
        result = None
        if self.pending:
            traj, n = self.batcher.get(blocking=False)
            if traj is None:
                return None
            self.pending = False
            result = self._summarise(traj, n)
        if self.last_launch is None or iteration - self.last_launch >= self.every:
            self.launch(weights(), iteration, env_steps)
        return result

    def final(self, weights: dict[str, torch.Tensor], iteration: int, env_steps: int) -> tuple[dict | None, dict]:
        """Waits for a pending evaluation, then evaluates ``weights`` again (blocking, fresh episodes).

        Returns:
            ``(the pending evaluation's result or None, the final result)``.
        """
        previous = None
        if self.pending:
            traj, n = self.batcher.get()
            self.pending = False
            previous = self._summarise(traj, n)
        self.launch(weights, iteration, env_steps)
        traj, n = self.batcher.get()
        self.pending = False
        return previous, self._summarise(traj, n)

    def _summarise(self, traj: Trajectories, n_running: int) -> dict[str, float]:
        self.evaluated_weights = self._launch_weights
        if n_running:
            log.warning("%d evaluation episodes did not finish within %d steps; their returns are partial",
                        n_running, self.batcher.n_timesteps)
        returns, lengths = episode_returns(traj)
        return {
            "eval/return": float(returns.mean()),
            "eval/return_min": float(returns.min()),
            "eval/return_max": float(returns.max()),
            "eval/length": float(lengths.float().mean()),
            "eval/episodes": float(returns.shape[0]),
            "eval/launch_env_steps": float(self._launch_steps),
        }

    def close(self) -> None:
        """Collects a pending evaluation (a worker must not be closed mid-acquisition) and closes the batcher."""
        try:
            if self.pending:
                self.batcher.get()
        except RLStructError as e:  # a failed batcher has nothing to collect; the original error is what matters
            log.debug("evaluation batcher: %s", e)
        finally:
            self.pending = False
            self.batcher.close()


# =============================================================================================== checkpoints and plots
CHECKPOINT_FORMAT = "rlstruct-checkpoint-1"


def save_checkpoint(path: str | os.PathLike, algo: str, config: RunConfig, spec: EnvSpec, model: nn.Module,
                    extra: dict[str, Any] | None = None) -> str:
    """Writes ``{format, algo, config, env_spec, model, ...}`` of plain types and CPU tensors.

    It loads with ``torch.load(path, weights_only=True)``.
    """
    data = {
        "format": CHECKPOINT_FORMAT,
        "algo": algo,
        "config": config.to_dict(),
        "env_spec": dataclasses.asdict(spec),
        "model": cpu_state_dict(model),
        **(extra or {}),
    }
    torch.save(data, path)
    return str(path)


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a checkpoint written by :func:`save_checkpoint` (``weights_only=True``, onto the CPU).

    Raises:
        ValueError: the file is not an rlstruct checkpoint.
    """
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{str(path)!r} is not an rlstruct checkpoint (no format {CHECKPOINT_FORMAT!r})")
    return data


def plot_learning_curve(history: list[dict[str, float]], path: str | os.PathLike, title: str) -> str | None:
    """Plots the evaluation and training returns against env steps and wall clock into a PNG.

    Returns:
        The path, or ``None`` when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'rlstruct[plot]'); no learning-curve plot")
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    train = [r for r in history if isinstance(r.get("train/episode_return"), float)
             and math.isfinite(r["train/episode_return"])]
    evals = [r for r in history if "eval/return" in r]
    for ax, x in zip(axes, ("env_steps", "wall_time_s")):
        if train:
            ax.plot([r[x] for r in train], [r["train/episode_return"] for r in train], color="tab:blue", alpha=0.4,
                    lw=1, label="training episodes")
        if evals:
            ax.plot([r[x] for r in evals], [r["eval/return"] for r in evals], "o-", color="tab:red", ms=3,
                    label="evaluation (mean)")
        ax.set_xlabel("env steps" if x == "env_steps" else "wall clock (s)")
        ax.set_ylabel("return")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


# =============================================================================================== train() scaffolding
@contextlib.contextmanager
def training_run(
    algo: str, config: RunConfig, spec: EnvSpec, *, start: float
) -> Iterator[tuple[Run, contextlib.ExitStack]]:
    """The frame of every ``train``: a :class:`Run`, and an exit stack that closes what the run opens.

    Sets ``torch`` to ``config.torch_threads`` threads (when set) for the run and restores the previous
    count on exit; the run and everything pushed on the stack are closed on exit, in reverse order,
    whether training returned or raised.

    Args:
        algo: the algorithm's name (the run's log folder and checkpoint say it).
        config: the validated config.
        spec: the env's description, from the algorithm's ``validate``.
        start: ``time.perf_counter()`` when ``train`` was called (validation counts in the wall time).

    Yields:
        ``(run, stack)``.
    """
    threads = torch.get_num_threads()
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    run = Run(algo, config, spec, start=start)
    with contextlib.ExitStack() as stack:
        stack.callback(torch.set_num_threads, threads)
        stack.callback(run.close)
        yield run, stack


def seeded_model(seed: int, factory: Callable[..., nn.Module], *args: Any) -> nn.Module:
    """``factory(*args)`` with its initial weights drawn from ``torch.manual_seed(seed)``.

    The global generator is forked, so building the model leaves it as it was.

    >>> a, b = seeded_model(0, nn.Linear, 2, 1), seeded_model(0, nn.Linear, 2, 1)
    >>> torch.equal(a.weight, b.weight)
    True
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory(*args)


def worker_args(config: RunConfig, spec: EnvSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """The keyword arguments every batcher's agent and env factories share: ``(agent_args, env_args)``.

    Each batcher adds its own ``device``, ``n_envs`` and ``autoreset``.
    """
    agent_args = {"obs_dim": spec.obs_dim, "n_actions": spec.n_actions, "hidden_sizes": tuple(config.hidden_sizes),
                  "check_device": config.check_devices}
    env_args = {"name": config.env, "backend": config.backend, "max_episode_steps": spec.max_episode_steps}
    return agent_args, env_args


def open_batchers(
    stack: contextlib.ExitStack,
    config: RunConfig,
    spec: EnvSpec,
    create_agent: Callable[..., RL_Agent],
    *,
    n_timesteps: int,
    autoreset: bool,
    explore: dict[str, bool | float],
    greedy: dict[str, bool | float],
) -> tuple[RL_Batcher, Evaluator]:
    """The training batcher and the :class:`Evaluator` of a run, both closed by ``stack``.

    Seeds are fixed per role (envs from offsets 0 and 1000, agents from 5000 and 6000) so that a run is
    reproducible from ``config.seed`` alone; evaluation envs never auto-reset and run whole episodes.

    Args:
        stack: the run's exit stack (see :func:`training_run`).
        config: the validated config.
        spec: the env's description.
        create_agent: the batchers' agent factory (module level, so it pickles), e.g. :func:`create_policy_agent`.
        n_timesteps: steps of every training env per ``execute``.
        autoreset: whether the training envs auto-reset.
        explore: the training ``agent_info``, one value per key, e.g. ``{"stochastic": True}``.
        greedy: the evaluation ``agent_info``, one value per key, e.g. ``{"epsilon": 0.0}``.

    Returns:
        ``(batcher, evaluator)``.
    """
    agent_args, env_args = worker_args(config, spec)
    n_workers = max(config.n_processes, 1)
    batcher = RL_Batcher(
        n_timesteps, create_agent, {**agent_args, "device": config.batcher_device},
        create_env, {**env_args, "n_envs": config.n_envs, "autoreset": autoreset, "device": config.batcher_device},
        config.n_processes, worker_seeds(config.seed, n_workers, 0),
        agent_info=DictTensor({k: torch.tensor([v]) for k, v in explore.items()}),
        agent_seeds=worker_seeds(config.seed, n_workers, 5000), device=config.batcher_device,
    )
    stack.callback(batcher.close)
    n_eval_workers = max(config.n_evaluation_processes, 1)
    eval_batcher = RL_Batcher(
        spec.max_episode_steps, create_agent, {**agent_args, "device": config.evaluation_device},
        create_env, {**env_args, "n_envs": config.n_evaluation_envs, "autoreset": False,
                     "device": config.evaluation_device},
        config.n_evaluation_processes, worker_seeds(config.seed, n_eval_workers, 1000),
        agent_info=DictTensor({k: torch.tensor([v]) for k, v in greedy.items()}),
        agent_seeds=worker_seeds(config.seed, n_eval_workers, 6000), device=config.evaluation_device,
    )
    n_eval = eval_batcher.n_elems()
    evaluator = Evaluator(eval_batcher, DictTensor({k: torch.full((n_eval,), v) for k, v in greedy.items()}),
                          config.eval_every)
    stack.callback(evaluator.close)
    return batcher, evaluator


def finish_training(run: Run, evaluator: Evaluator, model: nn.Module, spec: EnvSpec, *, title: str) -> TrainResult:
    """The end of every ``train``: final evaluation, checkpoint, learning curve and result.

    Where an evaluation reached the target return, the weights it evaluated are the ones kept (not those of
    the iterations since they were sent); otherwise the final weights are evaluated again on fresh episodes.

    Args:
        run: the run, still open (this closes it).
        evaluator: the run's evaluator.
        model: the learner's model.
        spec: the env's description.
        title: the algorithm's name in the plot's title, e.g. ``"A2C"``.
    """
    config = run.config
    if run.reached_target:
        model.load_state_dict(evaluator.evaluated_weights)
    previous, final = evaluator.final(cpu_state_dict(model), run.iteration, run.env_steps)
    if previous is not None:
        run.record_eval(previous)
    run.record_eval(final)
    wall = run.elapsed()
    run.close()
    checkpoint = save_checkpoint(run.logdir / "checkpoint.pt", run.algo, config, spec, model,
                                 {"env_steps": run.env_steps, "eval_return": final["eval/return"]})
    plot = plot_learning_curve(run.history, run.logdir / "learning_curve.png",
                               f"{title} on {config.env} ({config.backend}), seed {config.seed}")
    return TrainResult(final["eval/return"], run.env_steps, wall, run.history, str(run.logdir), run.iteration,
                       checkpoint, plot, run.target_return, run.reached_target)


# =============================================================================================== command line
def field_docs(cls: type) -> dict[str, str]:
    """The one-line description of every field, read from the ``Attributes:`` sections along the MRO."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = klass.__doc__ or ""
        section = re.split(r"\n\s*Attributes:\s*\n", doc, maxsplit=1)
        if len(section) < 2:
            continue
        for m in re.finditer(r"^\s{8}(\w+): (.+)$", section[1], flags=re.M):
            docs[m.group(1)] = m.group(2).strip()
    return docs


def _parse_optional(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = kind.__name__
    return parse


def build_parser(config_cls: type, prog: str, description: str = "") -> argparse.ArgumentParser:
    """An argument parser with one ``--flag-name`` per config field (help from :func:`field_docs`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    hints = typing.get_type_hints(config_cls)
    docs = field_docs(config_cls)
    for f in dataclasses.fields(config_cls):
        flag = "--" + f.name.replace("_", "-")
        hint = hints[f.name]
        kwargs: dict[str, Any] = {"default": f.default, "help": docs.get(f.name, ""), "dest": f.name}
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(hint) is tuple:
            kwargs.update(nargs="+", type=args[0])
        elif args and type(None) in typing.get_args(hint):
            kwargs["type"] = _parse_optional(args[0])
        else:
            kwargs["type"] = hint
        parser.add_argument(flag, **kwargs)
    return parser


def config_from_args(config_cls: type, ns: argparse.Namespace):
    """Builds the config dataclass from parsed arguments (lists become tuples)."""
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(config_cls)}
    return config_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def run_main(train: Callable[[Any], TrainResult], config_cls: type, validate: Callable[[Any], None],
             argv: Sequence[str] | None, prog: str, description: str) -> int:
    """The body of every algorithm's ``main``: parse, validate, train, report.

    A config error (an unknown env, a device this machine does not have, a value out of range) prints one
    line to stderr and returns 2. The last line on stdout is a JSON object with ``eval_return``,
    ``env_steps``, ``wall_time_s`` and ``logdir``.
    """
    parser = build_parser(config_cls, prog, description)
    ns = parser.parse_args(argv)
    try:
        config = config_from_args(config_cls, ns)
        validate(config)
    except (ValueError, TypeError, RLStructError) as e:
        print(f"{prog}: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    result = train(config)
    if result.reached_target:
        print(f"an evaluation reached the target return {result.target_return:g}: stopped and kept those weights")
    print(f"final evaluation return {result.eval_return:.2f} after {result.env_steps} env steps "
          f"in {result.wall_time_s:.1f} s")
    print(f"logs: {Path(result.logdir) / Run.CSV_NAME} (TensorBoard: tensorboard --logdir {result.logdir})")
    if result.plot:
        print(f"learning curve: {result.plot}")
    print(f"checkpoint: {result.checkpoint} (rlstruct eval {result.checkpoint})")
    print(json.dumps(result.summary()))
    return 0
