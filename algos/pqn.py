"""PQN: parallel Q-learning with LayerNorm and Q(lambda) targets, without replay buffer or target network.

Gallici et al. 2025, "Simplifying Deep Temporal Difference Learning" (ICLR).

The training batcher steps auto-reset envs ``n_steps`` at a time with an epsilon-greedy policy (epsilon decays
linearly over the first ``epsilon_decay_fraction`` of the step budget); the learner computes Q(lambda) targets
backwards over the collection with the network that collected it, then takes ``n_epochs`` passes of
``n_minibatches`` shuffled minibatches of gradient steps on the regression of ``Q(s_t, a_t)`` on those targets. The
LayerNorm of the Q-network (of its MLP, or of its CNN on image frames) is what keeps this off-policy TD regression
without a target network stable.

Targets bootstrap through time limits and not through terminations: a terminated step's target is its reward, a
truncated step's bootstraps from ``max_a Q(_observation/frame)`` (the terminal observation), and the lambda-trace
is cut at every episode end and at the collection's end.

The file reads top to bottom: the config, the Q(lambda) targets and the loss, the learn step, the network and its
exploration schedule, and ``ALGORITHM``, which hands them to the on-policy loop (:mod:`rlstruct.algos.harness`).

Run it with ``rlstruct train pqn --env CartPole-v1`` or ``python -m rlstruct.algos.pqn``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from rlstruct.agents import RL_Agent
from rlstruct.algos.harness import (
    ActorCriticLearner,
    Batch,
    EnvSpec,
    LearnFn,
    MinibatchPart,
    OnPolicyAlgorithm,
    OnPolicyConfig,
    OnPolicyModel,
    default,
    main,
    minibatch_epochs,
    reads,
    setting,
    trainer,
    training_agent_kwargs,
)
from rlstruct.algos.network_factories import Q_CONTRACT, check_network, network_model
from rlstruct.algos.policies import next_of_collection
from rlstruct.algos.qnetworks import QAgent, create_q_agent, epsilon_at, evaluation_info, q_network
from rlstruct.errors import ConfigError
from rlstruct.structures import DictTensor, Trajectories

__all__ = ["PQNConfig", "q_lambda_targets", "pqn_loss", "learn_step", "ALGORITHM", "train"]


@dataclasses.dataclass
class PQNConfig(MinibatchPart, OnPolicyConfig):
    """PQN's settings (each one's help is beside it; the family's are :class:`OnPolicyConfig`'s, the collection's and
    its minibatches' :class:`MinibatchPart`'s). Its Q-network is no actor-critic: it has no observation normaliser,
    no recurrent or compiled policy."""

    hidden_sizes: tuple[int, ...] = default((128, 128))
    lr: float = default(1e-3)
    eval_every: int = default(5)
    n_steps: int = default(32)
    n_minibatches: int = default(8)
    q_lambda: float = setting(0.65, "lambda of the Q(lambda) targets (0: one-step Q-learning targets)",
                              within="[0, 1]")
    epsilon_start: float = setting(1.0, "exploration rate at the start", within="[0, 1]")
    epsilon_end: float = setting(0.05, "exploration rate after the decay", within="[0, 1]")
    epsilon_decay_fraction: float = setting(0.2, "fraction of max_env_steps over which epsilon decays linearly",
                                            within="(0, 1]")
    reward_scale: float = setting(0.1, "multiply rewards by this in the targets")
    loss: str = setting("mse", "mse (half the squared TD error, the paper's) or huber", choices=("mse", "huber"))
    max_grad_norm: float = setting(10.0, "clip the global gradient norm to this (0: no clipping)")
    layer_norm: bool = setting(True, "a LayerNorm after each hidden layer of the Q-network, before its activation")
    activation: str = setting("relu", "the Q-network's hidden activation, relu or tanh", choices=("relu", "tanh"))

    RESUME_FIELDS: ClassVar[tuple[str, ...]] = ("layer_norm", "activation")


#: what ``rlstruct sweep pqn`` searches: field -> a range or choices, each holding the default
SEARCH_SPACE = {"lr": {"low": 1e-4, "high": 1e-2, "log": True},
                "gamma": {"choices": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999]},
                "n_steps": {"choices": [16, 32, 64]}, "n_minibatches": {"choices": [4, 8, 16]},
                "q_lambda": {"low": 0.3, "high": 0.95}, "epsilon_decay_fraction": {"low": 0.05, "high": 0.5}}


def check_config(config: PQNConfig) -> None:
    """Raises :class:`~rlstruct.errors.ConfigError` for the epsilon schedule without a step budget."""
    if config.max_env_steps is None:
        raise ConfigError("PQN decays epsilon over the step budget max_env_steps, got max_env_steps=None; pass "
                          "--max-env-steps N")


def check_env(config: PQNConfig, spec: EnvSpec) -> None:
    """Raises :class:`~rlstruct.errors.SpaceError` for continuous actions."""
    spec.require("PQN", config.env, discrete=True, fix="DQN")
    if config.network is not None:
        check_network(config.network, spec, Q_CONTRACT, algo="PQN")


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


@reads("frame", "action", "target")
def _minibatch_loss(model: torch.nn.Module, kind: str, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`pqn_loss` of a minibatch of ``M`` flat steps (what ``compile_update`` compiles): ``frame [M, *obs]``,
    ``action int64 [M]``, ``target float [M]``."""
    return pqn_loss(model(batch["frame"]), batch["action"], batch["target"], kind=kind)


def learn_step(config: PQNConfig, learner: ActorCriticLearner) -> LearnFn:
    """PQN's learn step: the Q(lambda) targets of the collection (with the weights that collected it: the agents'
    recorded ``max_q``, see :func:`~rlstruct.algos.policies.next_of_collection`), then
    ``n_epochs`` passes of ``n_minibatches`` shuffled minibatches, one update each (loss, backward, clipping,
    optimizer step; compiled with ``compile_update``). An auto-reset collection has no padding: every step counts."""
    model = learner.model
    # The minibatches' order: seeded per session, on the learner's device, apart from the agents' generators.
    shuffle = torch.Generator(device=learner.device).manual_seed(learner.seed)
    update = learner.update_step(functools.partial(_minibatch_loss, model, config.loss), config,
                                 max_grad_norm=config.max_grad_norm)

    def learn(traj: Trajectories, loss_rewards: torch.Tensor) -> dict[str, torch.Tensor]:
        tt = traj.trajectories
        frame = tt["observation/frame"]
        with torch.no_grad():  # the agents' max Q at the next step, the network on the episodes' final frames alone
            next_max_q = next_of_collection(tt["action/max_q"], tt, lambda f: model(f).float().amax(-1))
            targets = q_lambda_targets(loss_rewards * config.reward_scale, next_max_q, tt["_observation/terminated"],
                                       tt["_observation/done"], config.gamma, config.q_lambda)
        batch = {"frame": frame.flatten(0, 1), "action": tt["action/action"].flatten(0, 1),
                 "target": targets.flatten(0, 1)}
        stats, _ = minibatch_epochs(update, batch, n_epochs=config.n_epochs, n_minibatches=config.n_minibatches,
                                    shuffle=shuffle)
        stats["q/target"] = targets.mean()
        return stats

    return learn


def create_agent(config: Mapping[str, Any]) -> Callable[..., RL_Agent]:
    """The batchers' agent factory of a PQN run (its ``config`` as a dict), for training and for evaluating its
    weights: the epsilon-greedy :class:`~rlstruct.algos.dqn.QAgent` over its LayerNorm Q-network."""
    return functools.partial(create_q_agent, layer_norm=bool(config["layer_norm"]),
                             activation=str(config["activation"]), record_max_q=True)


def build_model(config: PQNConfig, spec: EnvSpec) -> torch.nn.Module:
    """The learner's Q-network (on the CPU; the loop seeds its weights)."""
    if config.network is not None:
        return network_model(config.network, spec)
    return q_network(spec, config.hidden_sizes, layer_norm=config.layer_norm, activation=config.activation)


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


def _agent_kwargs(config: PQNConfig) -> tuple[dict[str, object], dict[str, object]]:
    return training_agent_kwargs(config), {}


#: PQN's model: the LayerNorm Q-network, run by epsilon-greedy agents (the first epsilon until ``exploration``'s)
Q_NETWORK = OnPolicyModel(agent=create_agent, evaluation_info=evaluation_info,
                          explore=lambda config: {"epsilon": config.epsilon_start}, build=build_model,
                          learner_agent=lambda model, device, config: QAgent(model, device), agent_kwargs=_agent_kwargs)

ALGORITHM = OnPolicyAlgorithm(name="pqn", title="PQN", config_cls=PQNConfig, description=__doc__.splitlines()[0],
                              check_config=check_config, check_env=check_env, make_learn=learn_step, model=Q_NETWORK,
                              schedule=exploration, search_space=SEARCH_SPACE)
train = trainer(ALGORITHM)

if __name__ == "__main__":
    raise SystemExit(main("pqn"))
