"""PQN: parallel Q-learning with LayerNorm and Q(lambda) targets, without replay buffer or target network.

Gallici et al. 2025, "Simplifying Deep Temporal Difference Learning" (ICLR).

The training batcher steps auto-reset envs ``n_steps`` at a time with an epsilon-greedy policy (epsilon decays
linearly over the first ``epsilon_decay_fraction`` of the step budget); the learner computes Q(lambda) targets
backwards over the collection with the network that collected it, then takes ``n_epochs`` passes of
``n_minibatches`` shuffled minibatches of gradient steps on the regression of ``Q(s_t, a_t)`` on those targets. The
LayerNorm of the Q-network is what keeps this off-policy TD regression without a target network stable.

Targets bootstrap through time limits and not through terminations: a terminated step's target is its reward, a
truncated step's bootstraps from ``max_a Q(_observation/frame)`` (the terminal observation), and the lambda-trace
is cut at every episode end and at the collection's end.

The file reads top to bottom: the config, the Q(lambda) targets and the loss, the learn step, the network and its
exploration schedule, and a ``train`` that hands them to the on-policy loop (:mod:`rlstruct.algos.on_policy`).

Run it with ``rlstruct train pqn --env CartPole-v1`` or ``python -m rlstruct.algos.pqn``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from rlstruct.algos.command import run_main
from rlstruct.algos.dqn import QAgent, create_q_agent, epsilon_at, q_network
from rlstruct.algos.env_spec import EnvSpec
from rlstruct.algos.normalization import NormalizationConfig
from rlstruct.algos.on_policy import ActorCriticLearner, LearnFn, OnPolicyAlgorithm, PolicyNetworks, train_on_policy
from rlstruct.algos.record import TrainResult
from rlstruct.algos.setup import Setup, prepare
from rlstruct.algos.update import (
    FastPathConfig,
    UpdateStep,
    autocast_dtype,
    clip_groups,
    shuffled_minibatches,
    validate_fast_path,
)
from rlstruct.errors import ConfigError
from rlstruct.structures import DictTensor, Trajectories

__all__ = ["PQNConfig", "q_lambda_targets", "pqn_loss", "learn_step", "ALGORITHM", "validate", "train", "main"]


@dataclasses.dataclass
class PQNConfig(NormalizationConfig, FastPathConfig):
    """PQN settings (the shared ones are documented in :class:`RunConfig`, :class:`FastPathConfig` and
    :class:`NormalizationConfig`).

    Attributes:
        n_steps: steps of every env per update (the training batcher's n_timesteps).
        n_epochs: passes over each collection.
        n_minibatches: minibatches per pass (each one gradient step).
        gamma: discount factor.
        q_lambda: lambda of the Q(lambda) targets (0: one-step Q-learning targets, 1: Monte-Carlo returns).
        epsilon_start: exploration rate at the start.
        epsilon_end: exploration rate after the decay.
        epsilon_decay_fraction: fraction of max_env_steps over which epsilon decays linearly.
        reward_scale: multiply rewards by this in the targets.
        loss: mse (0.5 * squared TD error, the paper's) or huber.
        max_grad_norm: clip the gradient's global norm to this (0: no clipping).
        anneal_lr: decay the learning rate linearly to 0 over max_env_steps.
        layer_norm: a LayerNorm after each hidden layer of the Q-network, before its activation.
        activation: the Q-network's hidden activation, relu or tanh.
        overlap: collect the next batch while learning on this one (data one update stale).
    """

    n_envs: int = 32
    time_limit: float = 600.0
    max_env_steps: int | None = 500_000
    hidden_sizes: tuple[int, ...] = (128, 128)
    lr: float = 1e-3
    eval_every: int = 5
    n_steps: int = 32
    n_epochs: int = 4
    n_minibatches: int = 8
    gamma: float = 0.99
    q_lambda: float = 0.65
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_decay_fraction: float = 0.2
    reward_scale: float = 0.1
    loss: str = "mse"
    max_grad_norm: float = 10.0
    anneal_lr: bool = True
    layer_norm: bool = True
    activation: str = "relu"
    overlap: bool = False

    #: the settings a resumed run must share with its checkpoint, besides RunConfig's (see load_resume)
    RESUME_FIELDS = ("layer_norm", "activation", "normalize_rewards")


def check_config(config: PQNConfig) -> None:
    """PQN's own settings (the shared ones are :func:`~rlstruct.algos.config.validate_run_config`'s).

    Raises:
        ValueError: a setting is out of range.
        ConfigError: the epsilon schedule without a step budget, or a setting the Q-network does not take
            (``normalize_observations``, ``compile_policy``), or fast-path flags that cannot work together.
    """
    validate_fast_path(config, "PQN")
    for name in ("n_steps", "n_epochs", "n_minibatches"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)!r}")
    batch = config.n_envs * max(config.n_processes, 1) * config.n_steps
    if config.n_minibatches > batch:
        raise ValueError(f"n_minibatches must be <= the steps per collection (n_envs * max(n_processes, 1) * n_steps "
                         f"= {batch}), got {config.n_minibatches}; lower n_minibatches or collect more steps")
    for name in ("gamma", "q_lambda", "epsilon_start", "epsilon_end"):
        if not 0 <= getattr(config, name) <= 1:
            raise ValueError(f"{name} must lie in [0, 1], got {getattr(config, name)!r}")
    if not 0 < config.epsilon_decay_fraction <= 1:
        raise ValueError(f"epsilon_decay_fraction must lie in (0, 1], got {config.epsilon_decay_fraction!r}")
    if config.loss not in ("mse", "huber"):
        raise ValueError(f"loss must be 'mse' or 'huber', got {config.loss!r}")
    if config.activation not in ("relu", "tanh"):
        raise ValueError(f"activation must be 'relu' or 'tanh', got {config.activation!r}")
    if config.max_env_steps is None:
        raise ConfigError("PQN decays epsilon over the step budget max_env_steps, got max_env_steps=None; pass "
                          "--max-env-steps N")
    if config.normalize_observations or config.compile_policy:
        raise ConfigError("PQN's Q-network has no observation normaliser and its agent is not compiled, got "
                          f"normalize_observations={config.normalize_observations}, compile_policy="
                          f"{config.compile_policy}; drop --normalize-observations and --compile-policy")


def check_env(config: PQNConfig, spec: EnvSpec) -> None:
    """Raises :class:`~rlstruct.errors.SpaceError` for continuous actions or image observations."""
    spec.require("PQN", config.env, discrete=True, pixels=False, fix="DQN")


def q_lambda_targets(
    rewards: torch.Tensor,
    next_max_q: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    gamma: float,
    q_lambda: float,
) -> torch.Tensor:
    """Peng's Q(lambda) targets of a collection, computed backwards over time (Gallici et al. 2025, eq. 7).

    ``G_t = r_t + gamma * (1 - terminated_t) * [(1 - l_t) * max_a Q(s'_t, a) + l_t * G_{t+1}]`` with
    ``l_t = q_lambda * (1 - done_t)`` and ``l_{T-1} = 0``: a terminated step's target is its reward; a truncated one
    bootstraps from its terminal observation ``s'_t`` alone (the trace is cut at every episode end, where the next
    row is another episode's first step); the collection's last step bootstraps from ``max_a Q(s'_{T-1}, a)``.

    Args:
        rewards: ``float [B, T]``.
        next_max_q: ``float [B, T]``, ``max_a Q(s'_t, a)`` of each step's next observation (``_observation/frame``:
            the terminal one at an episode end), no gradient.
        terminated: ``bool [B, T]``, the episode ended in a terminal state (no bootstrap).
        done: ``bool [B, T]``, the episode ended (terminated or truncated: the trace stops).
        gamma: discount factor.
        q_lambda: the trace's decay (0: ``r + gamma * max Q(s')``; 1: returns to the collection's end).

    Returns:
        ``float [B, T]``, the targets.

    >>> r, q = torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[2.0, 4.0, 8.0]])
    >>> no = torch.zeros(1, 3, dtype=torch.bool)
    >>> q_lambda_targets(r, q, no, no, 0.5, 0.5)  # 1 + 0.5 * (0.5 * 2 + 0.5 * 3.25), 1 + 0.5 * (0.5 * 4 + 0.5 * 5)
    tensor([[2.3125, 3.2500, 5.0000]])
    >>> q_lambda_targets(r, q, torch.tensor([[False, True, False]]), torch.tensor([[False, True, False]]), 0.5, 0.5)
    tensor([[1.7500, 1.0000, 5.0000]])
    """
    T = rewards.shape[1]
    continues = (~terminated).to(rewards.dtype)
    traced = (~done).to(rewards.dtype) * q_lambda
    targets = torch.empty_like(rewards)
    g = next_max_q[:, -1]
    for t in reversed(range(T)):
        lam = traced[:, t] if t < T - 1 else torch.zeros_like(g)
        g = rewards[:, t] + gamma * continues[:, t] * ((1 - lam) * next_max_q[:, t] + lam * g)
        targets[:, t] = g
    return targets


def pqn_loss(q: torch.Tensor, actions: torch.Tensor, targets: torch.Tensor, *,
             kind: str = "mse") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The regression of ``Q(s, a)`` on Q(lambda) targets: ``mean(0.5 * (Q(s_t, a_t) - G_t)^2)`` (``mse``) or the
    mean Huber loss with delta 1 (``huber``).

    Args:
        q: ``float [N, A]``, the Q-values of the observations, with gradient.
        actions: ``int64 [N]``, the actions taken.
        targets: ``float [N]``, :func:`q_lambda_targets` (no gradient).
        kind: ``mse`` or ``huber``.

    Returns:
        ``(loss, stats)``: the scalar loss and detached 0-d statistics (``loss/td``, ``q/taken``).

    >>> loss, stats = pqn_loss(torch.tensor([[0.0, 1.0]]), torch.tensor([1]), torch.tensor([3.0]))
    >>> loss.item(), stats["q/taken"].item()
    (2.0, 1.0)
    >>> pqn_loss(torch.tensor([[0.0, 1.0]]), torch.tensor([1]), torch.tensor([3.0]), kind="huber")[0].item()
    1.5
    """
    taken = q.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    if kind == "huber":
        loss = F.smooth_l1_loss(taken, targets)
    else:
        loss = 0.5 * (taken - targets).pow(2).mean()
    return loss, {"loss/td": loss.detach(), "q/taken": taken.detach().mean()}


def _minibatch_loss(model: torch.nn.Module, kind: str, frame: torch.Tensor, action: torch.Tensor,
                    target: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`pqn_loss` of a minibatch of flat steps (what ``compile_update`` compiles)."""
    return pqn_loss(model(frame), action, target, kind=kind)


def learn_step(config: PQNConfig, learner: ActorCriticLearner) -> LearnFn:
    """PQN's learn step: the Q(lambda) targets of the collection (with the weights that collected it), then
    ``n_epochs`` passes of ``n_minibatches`` shuffled minibatches, one update each (loss, backward, clipping,
    optimizer step; compiled with ``compile_update``). An auto-reset collection has no padding: every step counts."""
    model = learner.model
    # The minibatches' order: seeded per session, on the learner's device, apart from the agents' generators.
    shuffle = torch.Generator(device=learner.device).manual_seed(learner.seed)
    update = UpdateStep(functools.partial(_minibatch_loss, model, config.loss), learner.optimizer, clip_groups(model),
                        max_grad_norm=config.max_grad_norm, device=learner.device, compile=config.compile_update,
                        autocast=autocast_dtype(config))

    def learn(traj: Trajectories, loss_rewards: torch.Tensor) -> dict[str, torch.Tensor]:
        tt = traj.trajectories
        frame, next_frame = tt["observation/frame"], tt["_observation/frame"]
        with torch.no_grad():
            next_max_q = model(next_frame.flatten(0, 1)).float().amax(-1).unflatten(0, next_frame.shape[:2])
            targets = q_lambda_targets(loss_rewards * config.reward_scale, next_max_q, tt["_observation/terminated"],
                                       tt["_observation/done"], config.gamma, config.q_lambda)
        data = (frame.flatten(0, 1), tt["action/action"].flatten(0, 1), targets.flatten(0, 1))
        rows = [update(*(x[mb] for x in data))
                for _ in range(config.n_epochs)
                for mb in shuffled_minibatches(data[0].shape[0], config.n_minibatches, shuffle)]
        stats = {key: torch.stack([r[key] for r in rows]).mean() for key in rows[0]}
        stats["q/target"] = targets.mean()
        return stats

    return learn


def q_networks(config: PQNConfig) -> PolicyNetworks:
    """PQN's Q-network (:func:`~rlstruct.algos.dqn.q_network` with ``layer_norm`` and ``activation``) and its
    epsilon-greedy agent."""
    return PolicyNetworks(q_network, create_q_agent, QAgent,
                          {"layer_norm": config.layer_norm, "activation": config.activation},
                          {"epsilon": config.epsilon_start})


def exploration(config: PQNConfig, env_steps: int, n_rows: int) -> tuple[DictTensor, dict[str, Any]]:
    """The epsilon of the collection starting at ``env_steps`` (linear decay over ``epsilon_decay_fraction`` of the
    budget) for each of ``n_rows`` envs, and as a statistic.

    >>> info, stats = exploration(PQNConfig(max_env_steps=1000, epsilon_decay_fraction=0.5, epsilon_end=0.0), 250, 2)
    >>> info["epsilon"].tolist(), stats
    ([0.5, 0.5], {'epsilon': 0.5})
    """
    decay_steps = max(1, int(config.epsilon_decay_fraction * config.max_env_steps))
    epsilon = epsilon_at(env_steps, config.epsilon_start, config.epsilon_end, decay_steps)
    return DictTensor({"epsilon": torch.full((n_rows,), epsilon)}), {"epsilon": epsilon}


ALGORITHM = OnPolicyAlgorithm(name="pqn", title="PQN", config_cls=PQNConfig, description=__doc__.splitlines()[0],
                              check_config=check_config, check_env=check_env, make_learn=learn_step,
                              networks=q_networks, schedule=exploration)


def validate(config: PQNConfig) -> Setup:
    """Checks the config before anything is built (see :func:`~rlstruct.algos.setup.prepare`).

    Raises:
        DeviceUnavailableError: a device of the config does not exist here.
        SpaceError: the env does not have discrete actions and flat observations.
        ValueError: a setting is out of range, or ``resume`` is not an rlstruct checkpoint.
        FileNotFoundError: ``resume`` does not exist.
        ConfigError: see :func:`check_config`; or ``resume`` holds another algorithm's run, or one trained with
            other :attr:`PQNConfig.RESUME_FIELDS` or shared settings (see :func:`load_resume`).
    """
    return prepare(ALGORITHM, config)


def train(config: PQNConfig) -> TrainResult:
    """Trains a Q-network with PQN and returns the final evaluation and the run's history.

    Raises:
        ValueError: what :func:`validate` raises.
        FileNotFoundError: ``resume`` does not exist.
    """
    return train_on_policy(validate(config))


def main(argv: Sequence[str] | None = None) -> int:
    """``rlstruct train pqn [flags]``; the last stdout line is a JSON summary."""
    return run_main(ALGORITHM, train_on_policy, argv)


if __name__ == "__main__":
    # Imported by name so that spawned workers unpickle this module's functions under their real name.
    from rlstruct.algos.pqn import main as _main

    raise SystemExit(_main())
