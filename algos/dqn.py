"""Double DQN with a target network, epsilon-greedy exploration and uniform replay (Mnih et al. 2015;
van Hasselt et al. 2016), with optional n-step returns.

The training batcher steps auto-reset envs ``rollout_steps`` at a time; each ``execute`` gets the current
epsilon as per-env ``agent_info``. Transitions go into the :class:`~rlstruct.algos.replay.ReplayBuffer`
(preallocated circular tensors on the learner device, written with index tensors, no Python loop per
transition; each observation stored once, see :meth:`~rlstruct.algos.replay.ReplayBuffer.push_steps`). With
``dueling=True`` the Q network has a dueling head (Wang et al. 2016). n-step returns are cut at
episode ends, and targets bootstrap through time limits and not through terminations: a truncated
transition bootstraps from ``Q(_observation/frame)`` (the terminal observation), a terminated one does not.

A resumed run (``resume``) restores the Q network, the target network, Adam's state and the count of gradient
steps (the hard target updates keep their cadence), and epsilon goes on decaying from the restored env-step
count; the replay buffer is not in the checkpoint, so it refills for ``learning_starts`` env steps before the
first gradient step of the new session.

Run it with ``rlstruct train dqn --env CartPole-v1`` or ``python -m rlstruct.algos.dqn``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.utils import clip_grad_norm_

from rlstruct.agents import RL_Agent, RL_Agent_CheckDevice
from rlstruct.algos.checkpoints import load_resume, restore_optimizer
from rlstruct.algos.cli import run_main
from rlstruct.algos.encoders import CNNEncoder
from rlstruct.algos.networks import NetworkAgent, cpu_state_dict, make_adam, mlp
from rlstruct.algos.replay import ReplayBuffer, steps_to_transitions
from rlstruct.algos.returns import episode_statistics
from rlstruct.algos.run import (
    EnvSpec,
    RunConfig,
    TrainResult,
    check_on_device,
    describe_env,
    finish_training,
    open_batchers,
    seeded_model,
    training_run,
    validate_run_config,
)
from rlstruct.devices import as_device
from rlstruct.structures import DictTensor, TemporalDictTensor

__all__ = [
    "DQNConfig",
    "QNetwork",
    "PixelQNetwork",
    "q_network",
    "dueling_q",
    "QAgent",
    "NStepWindow",
    "window_steps",
    "window_transitions",
    "n_step_returns",
    "double_dqn_targets",
    "create_q_agent",
    "dqn_loss",
    "epsilon_at",
    "train",
    "main",
]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class DQNConfig(RunConfig):
    """DQN settings (the shared ones are documented in :class:`RunConfig`).

    Attributes:
        rollout_steps: steps of every env per batcher execute (the training batcher's n_timesteps).
        buffer_size: replay buffer capacity in transitions.
        batch_size: transitions per gradient step.
        learning_starts: env steps collected before the first gradient step.
        gradient_steps: gradient steps after each execute.
        gamma: discount factor.
        n_step: steps per return (1: one-step TD targets).
        tau: target update rate (1: hard copy every target_update_interval gradient steps; < 1: Polyak every step).
        target_update_interval: gradient steps between two hard target updates (ignored when tau < 1).
        epsilon_start: exploration rate at the start.
        epsilon_end: exploration rate after the decay.
        epsilon_decay_steps: env steps of the linear decay from epsilon_start to epsilon_end.
        loss: huber or mse.
        max_grad_norm: clip the gradient's global norm to this (0: no clipping).
        dueling: a dueling head (Q = V + A - mean(A): value and advantage streams over a shared trunk).
    """

    n_envs: int = 4
    time_limit: float = 300.0
    max_env_steps: int | None = 50_000
    hidden_sizes: tuple[int, ...] = (128, 128)
    lr: float = 1e-3
    eval_every: int = 25
    rollout_steps: int = 16
    buffer_size: int = 50_000
    batch_size: int = 64
    learning_starts: int = 1_000
    gradient_steps: int = 32
    gamma: float = 0.99
    n_step: int = 1
    tau: float = 1.0
    target_update_interval: int = 128
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_decay_steps: int = 10_000
    loss: str = "huber"
    max_grad_norm: float = 10.0
    dueling: bool = False

    #: the settings a resumed run must share with its checkpoint, besides RunConfig's (see load_resume)
    RESUME_FIELDS = ("dueling",)


def validate(config: DQNConfig) -> EnvSpec:
    """Checks the config before anything is built and describes its env (see :func:`validate_run_config`).

    Raises:
        DeviceUnavailableError: a device of the config does not exist here.
        SpaceError: the env does not have discrete actions.
        ValueError: a setting is out of range, or ``resume`` is not an rlstruct checkpoint.
        FileNotFoundError: ``resume`` does not exist.
        ConfigError: ``resume`` holds another algorithm's run, or one trained with other
            :attr:`DQNConfig.RESUME_FIELDS` or shared settings (see :func:`load_resume`).
    """
    validate_run_config(config)
    positive = ("rollout_steps", "buffer_size", "batch_size", "n_step", "target_update_interval", "epsilon_decay_steps")
    for name in positive:
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)!r}")
    if config.gradient_steps < 0 or config.learning_starts < 0:
        raise ValueError("gradient_steps and learning_starts must be >= 0")
    if config.n_step > config.rollout_steps:
        raise ValueError(f"n_step must be <= rollout_steps (the first acquisition must hold one n-step return), "
                         f"got n_step={config.n_step}, rollout_steps={config.rollout_steps}")
    if not 0 < config.tau <= 1:
        raise ValueError(f"tau must lie in (0, 1], got {config.tau!r}")
    if config.loss not in ("huber", "mse"):
        raise ValueError(f"loss must be 'huber' or 'mse', got {config.loss!r}")
    spec = describe_env(config.env, config.backend, config.max_episode_steps)
    spec.require("DQN", config.env, discrete=True)
    load_resume("dqn", config, DQNConfig.RESUME_FIELDS)
    return spec


# =============================================================================================== model and agent
def dueling_q(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """The dueling aggregation (Wang et al. 2016, eq. 9): ``Q = V + A - mean_a(A)``.

    Subtracting the mean advantage makes ``V`` and ``A`` identifiable: ``mean_a Q(s, a) = V(s)``.

    Args:
        value: ``float [N, 1]``, the state values.
        advantage: ``float [N, A]``, the advantages.

    Returns:
        ``float [N, A]``, the Q-values.

    >>> dueling_q(torch.tensor([[1.0]]), torch.tensor([[0.0, 2.0]]))
    tensor([[0., 2.]])
    """
    return value + advantage - advantage.mean(-1, keepdim=True)


class QNetwork(nn.Module):
    """An MLP from a flat observation to one Q-value per action, with an optional dueling head.

    Without ``dueling`` the last hidden layer feeds one linear layer of ``n_actions`` outputs; with it, the
    hidden layers but the last are a shared trunk feeding two streams, each with its own last hidden layer:
    a value stream (1 output) and an advantage stream (``n_actions`` outputs), aggregated by :func:`dueling_q`.

    Args:
        obs_dim: observation size.
        n_actions: number of discrete actions.
        hidden_sizes: hidden layer widths.
        dueling: use the dueling head.

    >>> QNetwork(4, 2, (8,))(torch.zeros(3, 4)).shape
    torch.Size([3, 2])
    >>> QNetwork(4, 2, (8,), dueling=True)(torch.zeros(3, 4)).shape
    torch.Size([3, 2])
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int], *, dueling: bool = False):
        super().__init__()
        self.dueling = dueling
        if dueling:
            # As in Wang et al. (2016, figure 1), each stream has its own last hidden layer.
            *shared, last = hidden_sizes
            self.trunk = nn.Sequential(*mlp(obs_dim, shared[:-1], shared[-1]), nn.Tanh()) if shared else nn.Identity()
            width = shared[-1] if shared else obs_dim
            self.value = mlp(width, (last,), 1)
            self.advantage = mlp(width, (last,), n_actions)
        else:
            self.q = mlp(obs_dim, hidden_sizes, n_actions)

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        """Q-values ``[N, n_actions]`` of observations ``[N, obs_dim]`` of any dtype."""
        frame = frame.float()
        if self.dueling:
            h = self.trunk(frame)
            return dueling_q(self.value(h), self.advantage(h))
        return self.q(frame)


class PixelQNetwork(nn.Module):
    """The Q-network of image observations: the CNN of :class:`~rlstruct.algos.encoders.CNNEncoder` (Nature-DQN
    for Atari frames, MinAtar's for small ones) and a linear head, or a dueling one.

    Frames arrive as the env gives them (``uint8`` from the batcher, ``float32`` from
    :meth:`~rlstruct.algos.replay.ReplayBuffer.sample`); the encoder scales ``uint8`` envs' pixels by 1/255
    in either case.

    Args:
        obs_shape: one frame's shape (``[C, H, W]`` or ``[H, W, C]``).
        n_actions: number of discrete actions.
        obs_dtype: the env's frame dtype.
        obs_high: the largest value of ``uint8`` frames (``EnvSpec.obs_high``; default 255).
        dueling: use the dueling head.

    >>> PixelQNetwork((4, 84, 84), 4, obs_dtype="uint8")(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape
    torch.Size([2, 4])
    """

    def __init__(self, obs_shape: Sequence[int], n_actions: int, *, obs_dtype: str = "uint8",
                 obs_high: float | None = None, dueling: bool = False):
        super().__init__()
        self.dueling = dueling
        self.encoder = CNNEncoder(obs_shape, obs_dtype=obs_dtype, obs_high=obs_high)
        width = self.encoder.out_dim
        if dueling:
            self.value = mlp(width, (), 1)
            self.advantage = mlp(width, (), n_actions)
        else:
            self.q = mlp(width, (), n_actions)

    def forward(self, frame: torch.Tensor) -> torch.Tensor:
        """Q-values ``[N, n_actions]`` of frames ``[N, *obs_shape]``."""
        h = self.encoder(frame)
        if self.dueling:
            return dueling_q(self.value(h), self.advantage(h))
        return self.q(h)


def q_network(spec: EnvSpec, hidden_sizes: Sequence[int], *, dueling: bool = False) -> QNetwork | PixelQNetwork:
    """The Q-network for ``spec``'s env: :class:`PixelQNetwork` for images, :class:`QNetwork` (an MLP) otherwise.

    >>> from rlstruct.algos.run import EnvSpec
    >>> type(q_network(EnvSpec((10, 10, 4), "bool", 3, 1000), (64,))).__name__
    'PixelQNetwork'
    """
    if spec.pixels:
        return PixelQNetwork(spec.obs_shape, spec.n_actions, obs_dtype=spec.obs_dtype, obs_high=spec.obs_high,
                             dueling=dueling)
    return QNetwork(spec.obs_dim, spec.n_actions, hidden_sizes, dueling=dueling)


class QAgent(NetworkAgent):
    """Epsilon-greedy over a :class:`QNetwork`; ``agent_info["epsilon"]`` (float, one per env) sets the rate.

    Without the key the agent is greedy. Randomness comes from the agent's own generator (seeded by the
    batcher's ``agent_seeds``).

    Args:
        model: the Q network, on ``device``.
        device: where observations come from and actions go.
    """

    model: QNetwork

    def __call__(self, state, observation, agent_info, history=None):
        """``action int64 [N]``: uniform with probability ``epsilon``, else the argmax of the Q-values."""
        q = self.model(observation["frame"])
        action = q.argmax(-1)
        if "epsilon" in agent_info:
            eps = self._on_device(agent_info["epsilon"], "epsilon")
            B, n_actions = q.shape
            explore = torch.rand(B, generator=self.generator, device=self.device) < eps
            random_action = torch.randint(n_actions, (B,), generator=self.generator, device=self.device)
            action = torch.where(explore, random_action, action)
        return DictTensor({"action": action}), state


def create_q_agent(
    spec: EnvSpec, hidden_sizes: Sequence[int], device: str = "cpu", check_device: bool = False, *,
    dueling: bool = False,
) -> RL_Agent:
    """Builds a batcher's :class:`QAgent` for ``spec``'s env on ``device`` (module level, so it pickles;
    ``functools.partial(create_q_agent, dueling=True)`` too)."""
    model = q_network(spec, hidden_sizes, dueling=dueling).to(device)
    model.requires_grad_(False)
    agent: RL_Agent = QAgent(model, device)
    return RL_Agent_CheckDevice(agent, device) if check_device else agent


# =============================================================================================== n-step transitions
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


def window_steps(window: dict[str, torch.Tensor], gamma: float, n: int) -> dict[str, torch.Tensor]:
    """The n-step transitions of a window of consecutive steps of ``B`` auto-reset envs, as steps and the
    transitions over them (:meth:`~rlstruct.algos.replay.ReplayBuffer.push_steps`'s arguments).

    Args:
        window: ``[B, L, ...]`` tensors ``observation/frame``, ``action/action``, ``_observation/reward``,
            ``_observation/done``, ``_observation/terminated`` and ``_observation/frame``.
        gamma: discount factor.
        n: steps per return.

    Returns:
        The steps ``obs [B, L, *obs_shape]``, ``next_obs [B, L, *obs_shape]``, ``done bool [B, L]``, and the
        transitions starting at the first ``M = L - n + 1`` steps: ``action [B, M]``, ``ret [B, M]``,
        ``last int64 [B, M]`` (the step each ends at) and ``discount [B, M]`` (see :func:`n_step_returns`).
    """
    ret, last, discount = n_step_returns(window["_observation/reward"], window["_observation/done"],
                                         window["_observation/terminated"], gamma, n)
    return {"obs": window["observation/frame"], "next_obs": window["_observation/frame"],
            "done": window["_observation/done"], "action": window["action/action"][:, : ret.shape[1]], "ret": ret,
            "last": last, "discount": discount}


def window_transitions(window: dict[str, torch.Tensor], gamma: float, n: int) -> dict[str, torch.Tensor]:
    """The n-step transitions of a window of consecutive steps of ``B`` auto-reset envs, flattened (the arguments
    are :func:`window_steps`'s).

    Returns:
        ``obs [N, *obs_shape]``, ``action [N]``, ``ret [N]``, ``next_obs [N, *obs_shape]``, ``discount [N]`` with
        ``N = B * (L - n + 1)``: the transitions starting at the first ``L - n + 1`` steps.
    """
    return steps_to_transitions(window_steps(window, gamma, n))


class NStepWindow:
    """Turns consecutive acquisitions of auto-reset envs into n-step transitions.

    The batcher carries every env across ``execute`` calls, so the steps of one row are consecutive from
    one acquisition to the next: the last ``n - 1`` steps of a window are kept and put in front of the
    next acquisition, where they complete their n-step returns. After ``k`` acquisitions of ``T`` steps,
    ``B * (k * T - n + 1)`` transitions have come out, the same as from one window of ``k * T`` steps.

    Args:
        gamma: discount factor.
        n: steps per return (at most the steps of the first acquisition).
    """

    KEYS = ("observation/frame", "action/action", "_observation/reward", "_observation/done",
            "_observation/terminated", "_observation/frame")

    def __init__(self, gamma: float, n: int):
        self.gamma = gamma
        self.n = n
        self.carry: dict[str, torch.Tensor] | None = None

    def __call__(self, trajectories: TemporalDictTensor) -> dict[str, torch.Tensor]:
        """The transitions completed by this acquisition (``[B, T, ...]``, every row full), flattened."""
        return steps_to_transitions(self.steps(trajectories))

    def steps(self, trajectories: TemporalDictTensor) -> dict[str, torch.Tensor | int]:
        """The transitions completed by this acquisition as :func:`window_steps` gives them, with ``carried``: the
        steps of the window that the previous one held (:meth:`~rlstruct.algos.replay.ReplayBuffer.push_steps`'s
        arguments)."""
        if self.carry is None:
            window = {k: trajectories[k] for k in self.KEYS}
        else:
            window = {k: torch.cat([self.carry[k], trajectories[k]], 1) for k in self.KEYS}
        out: dict[str, torch.Tensor | int] = {**window_steps(window, self.gamma, self.n)}
        out["carried"] = 0 if self.carry is None else self.n - 1
        M = window["_observation/reward"].shape[1] - self.n + 1
        self.carry = {k: v[:, M:] for k, v in window.items()}
        return out


# =============================================================================================== loss
def dqn_loss(
    q: torch.Tensor,
    actions: torch.Tensor,
    returns: torch.Tensor,
    discounts: torch.Tensor,
    next_q_online: torch.Tensor,
    next_q_target: torch.Tensor,
    *,
    kind: str = "huber",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The double-DQN regression loss of ``Q(s, a)`` on :func:`double_dqn_targets`.

    Args:
        q: ``float [N, A]``, online Q-values of the observations, with gradient.
        actions: ``int64 [N]``.
        returns: ``float [N]`` (n-step) rewards.
        discounts: ``float [N]``, ``gamma^m`` or 0 at a termination.
        next_q_online: ``float [N, A]``, online Q-values of the next observations (no gradient).
        next_q_target: ``float [N, A]``, target-network Q-values of the next observations (no gradient).
        kind: ``huber`` (smooth L1, delta 1) or ``mse``.

    Returns:
        ``(loss, stats)``.

    >>> loss, _ = dqn_loss(torch.tensor([[0.0, 1.0]]), torch.tensor([1]), torch.tensor([1.0]), torch.tensor([0.5]),
    ...                    torch.tensor([[0.0, 1.0]]), torch.tensor([[8.0, 2.0]]), kind="mse")
    >>> float(loss)
    1.0
    """
    q_a = q.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        targets = double_dqn_targets(returns, discounts, next_q_online, next_q_target)
    if kind == "huber":
        loss = nn.functional.smooth_l1_loss(q_a, targets)
    else:
        loss = nn.functional.mse_loss(q_a, targets)
    return loss, {"loss/q": loss.detach(), "q_mean": q_a.detach().mean()}


def epsilon_at(env_steps: int, start: float, end: float, decay_steps: int) -> float:
    """Linear decay from ``start`` to ``end`` over ``decay_steps`` env steps, then constant.

    >>> epsilon_at(0, 1.0, 0.1, 100), epsilon_at(50, 1.0, 0.1, 100), epsilon_at(500, 1.0, 0.1, 100)
    (1.0, 0.55, 0.1)
    """
    if env_steps >= decay_steps:
        return end
    return start + env_steps / decay_steps * (end - start)


# =============================================================================================== training
def train(config: DQNConfig) -> TrainResult:
    """Trains a Q network with double DQN and returns the final evaluation and the run's history.

    Raises:
        DeviceUnavailableError: a device of the config does not exist here.
        SpaceError: the env does not have discrete actions.
        ValueError: a setting is out of range, or ``resume`` is not an rlstruct checkpoint.
        FileNotFoundError: ``resume`` does not exist.
        ConfigError: ``resume`` cannot be continued with this config (see :func:`validate`).
    """
    start = time.perf_counter()
    spec = validate(config)
    resume = load_resume("dqn", config, DQNConfig.RESUME_FIELDS)
    learner = as_device(config.learner_device)
    with training_run("dqn", config, spec, start=start, resume=resume) as (run, stack):
        model = seeded_model(config.seed, functools.partial(q_network, dueling=config.dueling), spec,
                             config.hidden_sizes)
        if resume is not None:
            model.load_state_dict(resume.model)
        create_agent = functools.partial(create_q_agent, dueling=config.dueling)
        batcher, evaluator = open_batchers(stack, config, spec, create_agent, n_timesteps=config.rollout_steps,
                                           autoreset=True, explore={"epsilon": config.epsilon_start},
                                           greedy={"epsilon": 0.0}, seed=run.seed)

        model.to(learner)
        target = copy.deepcopy(model).requires_grad_(False)
        optimizer = make_adam(model, config.lr, learner)
        buffer = ReplayBuffer.for_spec(spec, config.buffer_size, learner, seed=run.seed)
        B = batcher.n_elems()
        carry_return = torch.zeros(B, device=learner)
        carry_length = torch.zeros(B, dtype=torch.int64, device=learner)
        n_step = NStepWindow(config.gamma, config.n_step)
        n_updates = 0
        if resume is not None:
            target.load_state_dict(resume.learner["target"])
            restore_optimizer(optimizer, resume.learner["optimizer"], config.lr)
            n_updates = int(resume.learner["n_updates"])

        def learner_state() -> dict[str, Any]:  # what the checkpoint keeps besides the weights (see --resume)
            return {"optimizer": optimizer.state_dict(), "target": target.state_dict(), "n_updates": n_updates}
        first_step = run.env_steps  # the (re)filling of the buffer counts from this session's first step

        weights = cpu_state_dict(model)
        batcher.update(weights)
        batcher.reset()
        evaluator.launch(weights, run.iteration, run.env_steps)
        while not run.should_stop():
            epsilon = epsilon_at(run.env_steps, config.epsilon_start, config.epsilon_end, config.epsilon_decay_steps)
            batcher.execute(agent_info=DictTensor({"epsilon": torch.full((B,), epsilon)}))
            traj, _ = batcher.get()
            traj = traj.to(learner)
            if config.check_devices:
                check_on_device(traj, learner, "the trajectories given to the learner")
                check_on_device(model, learner, "the learner's model")
            tt = traj.trajectories
            buffer.push_steps(**n_step.steps(tt))

            stats: dict[str, Any] = {"epsilon": epsilon, "buffer_size": float(len(buffer))}
            steps_now = run.env_steps + B * tt.temporal_size()
            learning = steps_now - first_step >= config.learning_starts and len(buffer) >= config.batch_size
            if learning and config.gradient_steps:
                for _ in range(config.gradient_steps):
                    batch = buffer.sample(config.batch_size)
                    q = model(batch["obs"])
                    with torch.no_grad():
                        next_q_online = model(batch["next_obs"])
                        next_q_target = target(batch["next_obs"])
                    loss, loss_stats = dqn_loss(q, batch["action"], batch["ret"], batch["discount"], next_q_online,
                                                next_q_target, kind=config.loss)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if config.max_grad_norm > 0:
                        loss_stats["grad_norm"] = clip_grad_norm_(model.parameters(), config.max_grad_norm)
                    optimizer.step()
                    n_updates += 1
                    with torch.no_grad():
                        if config.tau < 1:
                            torch._foreach_lerp_(list(target.parameters()), list(model.parameters()), config.tau)
                        elif n_updates % config.target_update_interval == 0:
                            target.load_state_dict(model.state_dict())
                stats.update(loss_stats)
                weights = cpu_state_dict(model)
                batcher.update(weights)

            ret_sum, len_sum, count, carry_return, carry_length = episode_statistics(
                tt["_observation/reward"], tt["_observation/done"], carry_return, carry_length
            )
            # nan (0 / 0) when no episode ended in this window.
            stats["train/episode_return"] = ret_sum / count
            stats["train/episode_length"] = len_sum / count
            run.record(B * tt.temporal_size(), stats)
            run.poll_evaluation(evaluator, lambda: weights)
            run.poll_checkpoint(model, learner_state)

        return finish_training(run, evaluator, model, spec, title="DQN", learner=learner_state())


def main(argv: Sequence[str] | None = None) -> int:
    """``rlstruct train dqn [flags]``; the last stdout line is a JSON summary."""
    return run_main(train, DQNConfig, validate, argv, "rlstruct train dqn", __doc__.splitlines()[0])


if __name__ == "__main__":
    # Imported by name so that spawned workers unpickle this module's functions under their real name.
    from rlstruct.algos.dqn import main as _main

    raise SystemExit(_main())
