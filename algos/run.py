"""The run every ``train`` shares: its config base, env description, clock and logs, batchers and result.

:class:`RunConfig` holds the settings every algorithm shares (each algorithm's config extends it);
:func:`describe_env` reads what the networks need from an env; :func:`training_run`, :func:`open_batchers`
and :func:`finish_training` are the frame of every ``train``: a :class:`Run` (clock, budget,
``progress.csv``, TensorBoard, progress bar), the training batcher and the
:class:`~rlstruct.algos.evaluation.Evaluator`, then the final evaluation, the checkpoint and the
:class:`TrainResult`. A run given a :class:`~rlstruct.algos.checkpoints.Resume` (``--resume``) continues the
counters, the log folder and ``progress.csv`` of the run that wrote it, with seeds of its own
(:func:`session_seed`).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import inspect
import json
import logging
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlstruct.agents import RL_Agent
from rlstruct.algos.checkpoints import CHECKPOINT_NAME, Resume, plot_learning_curve, save_checkpoint
from rlstruct.algos.evaluation import Evaluator
from rlstruct.algos.networks import cpu_state_dict
from rlstruct.batchers import RL_Batcher
from rlstruct.devices import DeviceLike, as_device, check_device_exists
from rlstruct.envs import make_env
from rlstruct.envs.factory import BACKENDS, resolve_backend
from rlstruct.errors import DeviceMismatchError, SpaceError
from rlstruct.structures import DictTensor, Trajectories

__all__ = [
    "RunConfig",
    "validate_run_config",
    "EnvSpec",
    "describe_env",
    "create_env",
    "worker_seeds",
    "session_seed",
    "TrainResult",
    "Run",
    "check_on_device",
    "training_run",
    "seeded_model",
    "open_batchers",
    "finish_training",
]

log = logging.getLogger(__name__)

#: the values of ``RunConfig.matmul_precision`` (torch's ``set_float32_matmul_precision``)
MATMUL_PRECISIONS = ("highest", "high", "medium")


@dataclasses.dataclass
class RunConfig:
    """Settings every algorithm shares: environment, devices, budget, evaluation and logging.

    Attributes:
        env: gymnasium id of the environment, e.g. CartPole-v1 or Acrobot-v1.
        backend: auto (torch where rlstruct simulates the id, ale for ALE/ ids, else gymnasium), torch (rlstruct's
            torch simulators), gymnasium, envpool, ale (ale-py's vector env), gymnax (JAX), mjx or mujoco_torch
            (gymnasium's MuJoCo locomotion tasks on MJX or mujoco-torch), or brax (Brax's envs by name, e.g. ant).
        n_envs: environments per training worker (the batch is n_envs * max(n_processes, 1) envs).
        n_processes: training batcher worker processes (0 steps the envs in this process).
        max_episode_steps: episode time limit (truncation); None keeps the env's own.
        physics_dtype: float64 (gymnasium's doubles) or float32 (half the state traffic: throughput on a GPU), the
            physics precision of rlstruct's torch simulators (the torch backend only).
        learner_device: where the model, the loss and the optimizer (and a replay buffer) live.
        batcher_device: where the training batcher's envs, agents and buffer live.
        evaluation_device: where the evaluation batcher's envs, agent and buffer live.
        seed: seeds the networks, the envs and the agents.
        time_limit: stop training after this many seconds of wall clock (setup included); the evaluation under way
            and the final one still run to their end (bound them with evaluation_max_steps, n_evaluation_envs).
        max_env_steps: stop training after this many training env steps (None: no limit).
        target_return: stop once an evaluation of trained weights reaches this mean return, and keep those weights.
        stop_at_reward_threshold: without target_return, use the env's gymnasium reward_threshold (CartPole-v1: 475).
        hidden_sizes: hidden layer widths of the networks.
        lr: Adam learning rate.
        n_evaluation_envs: episodes per evaluation (episodic envs of the evaluation batcher).
        n_evaluation_processes: evaluation worker processes (0 evaluates in this process, pausing training).
        evaluation_max_steps: steps per evaluation episode at most (None: the env's time limit); an episode cut
            there counts its partial return.
        evaluation_chunk_steps: steps per acquisition of the evaluation batcher: its buffer holds this many steps of
            every evaluation env, and longer episodes continue over several acquisitions (with evaluation worker
            processes, at least one per training iteration).
        eval_every: training iterations at least between two evaluation launches.
        logdir: where progress.csv, TensorBoard events, the plot and the checkpoint go (None: runs/<algo>-<env>-<seed>,
            or with resume the resumed run's folder).
        log_every: iterations between two TensorBoard and progress-bar updates (the CSV gets every one).
        progress: show a tqdm progress bar on stderr.
        tensorboard: write TensorBoard event files into logdir.
        check_devices: wrap every agent in RL_Agent_CheckDevice and replay the learner's forward through it (slow).
        torch_threads: torch intra-op threads of the learner process (0 keeps torch's default).
        batcher_timeout: seconds a batcher waits for a worker's answer (one acquisition, a reset, the start) before
            it fails the run; raise it for slow simulators or long acquisitions.
        matmul_precision: float32 matrix products in this process (the learner and in-process batchers), torch's
            set_float32_matmul_precision for the run: highest (full float32), high (TF32 tensor cores on NVIDIA
            GPUs from Ampere on; other bits than float32), or medium (bfloat16 products where supported). Worker
            processes keep torch's default.
        resume: a checkpoint.pt, or the log folder of a run, to continue training from: the weights, the optimizers'
            state and the learner's (the replay buffer is not saved: DQN and SAC refill it for learning_starts env
            steps before learning again); env_steps and the iteration count continue (max_env_steps counts the
            total, and a learning-rate schedule over it goes on where it stopped; lr is this command's), time_limit
            counts this process's clock (a schedule over it starts again), and progress.csv in logdir gets the new
            rows after the earlier ones. The envs start fresh episodes with seeds drawn from seed and the iteration
            resumed at. The settings that shape the networks or the data (env, backend, hidden_sizes, ...) must
            equal the checkpoint's.
        checkpoint_every: also write the checkpoint every this many training iterations (0: only at the end and on
            Ctrl-C or SIGTERM), so that a run killed outright (SIGKILL, a lost node) can be resumed from the last one;
            each costs a host sync and a copy of the learner's state to the CPU.
    """

    env: str = "CartPole-v1"
    backend: str = "auto"
    n_envs: int = 16
    n_processes: int = 0
    max_episode_steps: int | None = None
    physics_dtype: str = "float64"
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
    evaluation_max_steps: int | None = None
    evaluation_chunk_steps: int = 256
    eval_every: int = 50
    logdir: str | None = None
    log_every: int = 10
    progress: bool = True
    tensorboard: bool = True
    check_devices: bool = False
    torch_threads: int = 1
    batcher_timeout: float = 120.0
    matmul_precision: str = "highest"
    resume: str | None = None
    checkpoint_every: int = 0

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
    for name in ("n_envs", "n_evaluation_envs", "evaluation_chunk_steps", "eval_every", "log_every"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)!r}")
    for name in ("n_processes", "n_evaluation_processes", "torch_threads", "checkpoint_every"):
        if getattr(config, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(config, name)!r}")
    if not 0 <= config.seed < 2**31:
        raise ValueError(f"seed must be an int in [0, 2**31), got {config.seed!r}; pass e.g. --seed 0")
    if not config.lr > 0:
        raise ValueError(f"lr must be > 0, got {config.lr!r}; pass e.g. --lr 3e-4")
    check_physics_dtype(config.physics_dtype, config.env, config.backend)
    if config.matmul_precision not in MATMUL_PRECISIONS:
        raise ValueError(
            f"matmul_precision must be one of {list(MATMUL_PRECISIONS)}, got {config.matmul_precision!r}; pass "
            "--matmul-precision high for TF32 on a GPU, or leave the default (highest: full float32)"
        )
    for name in ("time_limit", "batcher_timeout"):
        if not getattr(config, name) > 0:
            raise ValueError(f"{name} must be > 0 seconds, got {getattr(config, name)!r}")
    for name in ("max_env_steps", "evaluation_max_steps"):
        if getattr(config, name) is not None and getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {getattr(config, name)!r}")
    if not config.hidden_sizes or min(config.hidden_sizes) < 1:
        raise ValueError(f"hidden_sizes must be one or more positive widths, got {config.hidden_sizes!r}")
    for name in ("learner_device", "batcher_device", "evaluation_device"):
        check_device_exists(getattr(config, name), argument=name)


def check_physics_dtype(physics_dtype: str, env: str, backend: str) -> None:
    """Checks a ``physics_dtype`` setting: ``"float64"``, or ``"float32"`` for an env on the torch backend.

    Raises:
        ValueError: another value, or float32 for an env another backend steps.
    """
    if physics_dtype not in ("float64", "float32"):
        raise ValueError(f"physics_dtype must be 'float64' or 'float32', got {physics_dtype!r}")
    resolved = resolve_backend(env, backend)
    if physics_dtype != "float64" and resolved != "torch":
        raise ValueError(
            f"physics_dtype={physics_dtype!r} sets the precision of rlstruct's torch simulators, but env={env!r} "
            f"runs on the {resolved!r} backend; pass --backend torch with a torch simulator, or leave physics_dtype "
            "at 'float64'"
        )


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What the learner needs to know about an env to build its networks.

    An env has discrete actions (``n_actions`` set, ``action_shape == ()``) or continuous ones (a 1-d Box:
    ``n_actions`` is ``None`` and ``action_low``/``action_high`` hold its bounds); its observation ``frame``
    is flat (``obs_shape == (obs_dim,)``) or an image (3 dimensions, e.g. ``(4, 84, 84)`` uint8).

    Attributes:
        obs_shape: shape of one observation ``frame``.
        obs_dtype: its dtype's name, e.g. ``"float32"`` or ``"uint8"``.
        n_actions: number of discrete actions, or ``None`` for continuous actions.
        max_episode_steps: the episode time limit.
        reward_threshold: gymnasium's "solved" return for the id (475 for CartPole-v1), or None.
        action_shape: shape of one action (``()`` for discrete actions).
        action_low: lower bounds of a continuous action, flat (``None`` for discrete actions).
        action_high: upper bounds of a continuous action, flat (``None`` for discrete actions).
        obs_high: the largest value of a ``uint8`` observation (its space's ``high``: 255 for Atari pixels, 1 for
            0/1 planes), by which the encoders divide; ``None`` for other dtypes.

    >>> spec = EnvSpec((3,), "float32", None, 200, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
    >>> spec.obs_dim, spec.discrete, spec.action_dim, spec.pixels
    (3, False, 1, False)
    """

    obs_shape: tuple[int, ...]
    obs_dtype: str
    n_actions: int | None
    max_episode_steps: int
    reward_threshold: float | None = None
    action_shape: tuple[int, ...] = ()
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    obs_high: float | None = None

    @property
    def obs_dim(self) -> int:
        """The number of values in one observation ``frame``."""
        return math.prod(self.obs_shape)

    @property
    def discrete(self) -> bool:
        """Whether the actions are discrete."""
        return self.n_actions is not None

    @property
    def action_dim(self) -> int:
        """The number of values in one continuous action (1 for a discrete action)."""
        return math.prod(self.action_shape)

    @property
    def pixels(self) -> bool:
        """Whether the observation is an image (3 dimensions)."""
        return len(self.obs_shape) == 3

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EnvSpec:
        """The spec of ``dataclasses.asdict(spec)`` (as a checkpoint stores it; lists become tuples)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in fields})

    def require(self, algo: str, env: str, *, discrete: bool | None = None, pixels: bool | None = None,
                fix: str = "another algorithm") -> None:
        """Raises :class:`~rlstruct.errors.SpaceError` when ``algo`` does not support this env's spaces.

        Args:
            algo: the algorithm's name, for the message.
            env: the env's id, for the message.
            discrete: ``True``/``False`` when ``algo`` takes only discrete/continuous actions (``None``: both).
            pixels: ``False`` when ``algo`` takes only flat observations (``None``: both).
            fix: what else the user may pick, for the message.
        """
        if discrete is not None and discrete != self.discrete:
            want, got = ("discrete", "continuous") if discrete else ("continuous", "discrete")
            raise SpaceError(
                f"{algo} takes {want} actions, got env={env!r} with {got} actions (action_shape={self.action_shape}, "
                f"n_actions={self.n_actions}); pick an env with {want} actions or {fix}"
            )
        if pixels is False and self.pixels:
            raise SpaceError(
                f"{algo} takes flat observations, got env={env!r} with image observations of shape {self.obs_shape}; "
                f"pick an env with flat observations or {fix}"
            )


def describe_env(name: str, backend: str, max_episode_steps: int | None) -> EnvSpec:
    """Builds one CPU env of ``name`` to read its spaces and time limit.

    The time limit is ``max_episode_steps`` when given, else the env's own: the torch simulators' and gymnax's
    ``max_episode_steps``, the id's registered ``max_episode_steps``, or, for Atari (the ``ale`` backend and
    ``ALE/`` ids), the emulator's cap on frames per episode in agent steps (ale-py's
    ``max_num_frames_per_episode // frameskip``: 108,000 frames, 27,000 steps for the v5 ids).

    Raises:
        SpaceError: the action space is neither Discrete nor a 1-d Box, or the observation is not a Box
            of 1 (flat) or 3 (image) dimensions.
        ValueError: the env has no time limit and ``max_episode_steps`` is ``None``.
    """
    backend = resolve_backend(name, backend)
    env = make_env(name, 1, backend=backend, max_episode_steps=max_episode_steps)
    try:
        act, obs = env.action_space, env.observation_space
        limit = max_episode_steps
        if limit is None:
            limit = getattr(env, "max_episode_steps", None)
        if limit is None and backend != "torch":
            limit = _registered_time_limit(name)
        if limit is None and (backend == "ale" or name.startswith("ALE/")):
            limit = _ale_time_limit(name, backend)
    finally:
        env.close()
    if not isinstance(obs, gym.spaces.Box) or len(obs.shape) not in (1, 3):
        raise SpaceError(
            f"env={name!r} has observation space {obs}; the algorithms here take a Box of 1 (flat) or 3 (image) "
            "dimensions: flatten the observation or pick another env"
        )
    if limit is None:
        raise ValueError(f"max_episode_steps must be set for env={name!r}, which has no time limit of its own, got "
                         "None; pass max_episode_steps (--max-episode-steps)")
    try:
        threshold = gym.spec(name).reward_threshold
    except gym.error.Error:
        threshold = None
    threshold = None if threshold is None else float(threshold)
    obs_high = float(np.max(obs.high)) if np.dtype(obs.dtype) == np.uint8 else None
    common = {"obs_shape": tuple(int(d) for d in obs.shape), "obs_dtype": np.dtype(obs.dtype).name,
              "obs_high": obs_high, "max_episode_steps": int(limit), "reward_threshold": threshold}
    if isinstance(act, gym.spaces.Discrete):
        if int(act.start) != 0:  # the policies pick actions in [0, n): start + k would never be sent
            raise SpaceError(f"env={name!r} has action space {act}, whose actions start at {int(act.start)}; the "
                             "algorithms here pick actions in [0, n): shift them with a gymnasium ActionWrapper")
        return EnvSpec(n_actions=int(act.n), **common)
    if isinstance(act, gym.spaces.Box) and len(act.shape) == 1:
        if not (np.isfinite(act.low).all() and np.isfinite(act.high).all()):
            raise SpaceError(f"env={name!r} has action space {act} with infinite bounds; the algorithms here need "
                             "finite bounds (wrap the env with gymnasium's ClipAction and a bounded space)")
        return EnvSpec(n_actions=None, action_shape=tuple(int(d) for d in act.shape),
                       action_low=tuple(float(x) for x in act.low), action_high=tuple(float(x) for x in act.high),
                       **common)
    raise SpaceError(
        f"env={name!r} has action space {act}; the algorithms here take Discrete or 1-d Box actions: "
        "pick another env"
    )


def _registered_time_limit(name: str) -> int | None:
    try:
        return gym.spec(name).max_episode_steps
    except gym.error.Error:
        return None


def _ale_time_limit(name: str, backend: str) -> int | None:
    """The agent steps of ALE's cap on emulator frames per episode, as the env of ``name`` was built: the
    registered id's arguments (gymnasium backend) or the defaults of ale-py's ``AtariVectorEnv`` (ale backend)."""
    if backend == "ale":
        from ale_py.vector_env import AtariVectorEnv

        params = inspect.signature(AtariVectorEnv).parameters
        frames, skip = params["max_num_frames_per_episode"].default, params["frameskip"].default
    else:
        kwargs = gym.spec(name).kwargs
        frames, skip = kwargs.get("max_num_frames_per_episode"), kwargs.get("frameskip", 1)
    if not isinstance(frames, int) or frames <= 0 or not isinstance(skip, int) or skip < 1:
        return None  # no cap (0), or a stochastic frameskip (a range): no step count to derive
    return frames // skip


def create_env(
    name: str,
    n_envs: int,
    *,
    seed: int,
    device: str = "cpu",
    autoreset: bool = False,
    backend: str = "torch",
    max_episode_steps: int | None = None,
    physics_dtype: str = "float64",
):
    """The batchers' ``create_env``: :func:`rlstruct.envs.make_env` with keyword arguments (pickles);
    ``physics_dtype`` other than float64 goes to the torch simulators."""
    extra = {} if physics_dtype == "float64" else {"backend_kwargs": {"physics_dtype": getattr(torch, physics_dtype)}}
    return make_env(
        name, n_envs, device=device, seed=seed, autoreset=autoreset, backend=backend,
        max_episode_steps=max_episode_steps, **extra,
    )


def worker_seeds(seed: int, n_workers: int, offset: int) -> list[int]:
    """Distinct env/agent seeds per worker, per batcher (``offset`` tells batchers apart), in ``[0, 2**31)``.

    >>> worker_seeds(3, 2, 1000), worker_seeds(2**31 - 1, 1, 0)
    ([31000, 31001], [2147473648])
    """
    # Seeds below 214,748 keep their historical values; larger ones wrap into the envs' seed range.
    return [(seed * 10_000 + offset + k) % 2**31 for k in range(n_workers)]


def session_seed(seed: int, iteration: int) -> int:
    """The seed of a training session's envs, agents and learner generators: ``seed`` for a fresh run
    (``iteration`` 0), else a hash of ``(seed, iteration)`` in ``[0, 214,748)`` (where :func:`worker_seeds` does not
    wrap), so that a run resumed at ``iteration`` does not replay the episodes and samples of its first session.

    >>> session_seed(7, 0), session_seed(7, 120) == session_seed(7, 120), session_seed(7, 120) != session_seed(7, 121)
    (7, True, True)
    """
    if iteration == 0:
        return seed
    digest = hashlib.sha256(f"rlstruct-resume/{seed}/{iteration}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % 214_748


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
        interrupted: whether a Ctrl-C (SIGINT) or a SIGTERM stopped training early; ``eval_return`` is then the
            last evaluation's (nan if none finished): the final evaluation is skipped.
        stop_signal: the signal that did (``"SIGINT"``, ``"SIGTERM"``), else ``None``.
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
    interrupted: bool = False
    stop_signal: str | None = None

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
            "interrupted": self.interrupted,
            "stop_signal": self.stop_signal,
        }


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
        resume: the checkpoint the run continues (``None``: a fresh run). Its ``iteration``, ``env_steps`` and wall
            time are the counters' starting values; the log folder defaults to the checkpoint's; the rows of
            ``progress.csv`` of the checkpoint's folder up to its iteration come first in :attr:`history` and in
            the new ``progress.csv``.

    Attributes:
        seed: the seed of this session's envs, agents and generators (:func:`session_seed`).
    """

    CSV_NAME = "progress.csv"
    SUMMARY_NAME = "summary.json"

    def __init__(self, algo: str, config: RunConfig, spec: EnvSpec, *, start: float | None = None,
                 resume: Resume | None = None):
        self.algo = algo
        self.config = config
        self.spec = spec
        self.target_return = config.target_return
        if self.target_return is None and config.stop_at_reward_threshold:
            self.target_return = spec.reward_threshold
        self.start = time.perf_counter() if start is None else start
        default = f"runs/{algo}-{config.env}-{config.seed}" if resume is None else resume.folder
        self.logdir = Path(config.logdir or default)
        self.logdir.mkdir(parents=True, exist_ok=True)
        earlier = len(list(self.logdir.glob("events.out.tfevents.*")))
        if earlier and resume is None:
            log.warning("%s already holds %d TensorBoard event file(s) of earlier runs, which TensorBoard will show "
                        "beside this one's (progress.csv, the checkpoint and the summary are replaced); pass a new "
                        "--logdir to keep runs apart", self.logdir, earlier)
        self.env_steps = 0 if resume is None else resume.env_steps
        self.iteration = 0 if resume is None else resume.iteration
        self.seed = session_seed(config.seed, self.iteration)
        #: the wall time of the earlier sessions of a resumed run: rows count ``wall_time_s`` over all of them
        self.wall_offset = 0.0 if resume is None else resume.wall_time_s
        self.history: list[dict[str, float]] = [] if resume is None else _earlier_rows(resume)
        self.last_eval: float | None = None
        self.reached_target = False
        #: the signal (``"SIGINT"``: a Ctrl-C, or ``"SIGTERM"``) that interrupted the run during
        #: :func:`training_run`, else ``None``: the loop stops at its next check
        self.stop_signal: str | None = None
        self._pending: list[dict[str, Any]] = []
        self._csv_file = open(self.logdir / self.CSV_NAME, "w", newline="")
        self._csv_fields: list[str] = list(dict.fromkeys(k for r in self.history for k in r))
        self._csv: csv.DictWriter | None = None
        self._tb = self._open_tensorboard() if config.tensorboard else None
        self._bar = self._open_progress() if config.progress else None
        self._bar_steps = self.env_steps
        self._rate = (self.start, self.env_steps)
        if self.history:  # the earlier sessions' rows first (the file is rewritten: it may be this very one)
            self._write([], tb_rows=[])
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
        return tqdm(total=self.config.max_env_steps, initial=self.env_steps, unit="step", unit_scale=True,
                    file=sys.stderr, dynamic_ncols=True, mininterval=0.5, desc=f"{self.algo} {self.config.env}")

    @property
    def interrupted(self) -> bool:
        """Whether a signal interrupted the run (see :attr:`stop_signal`)."""
        return self.stop_signal is not None

    # ------------------------------------------------------------------ budget
    def elapsed(self) -> float:
        """Seconds since the run started (in this process: what ``time_limit`` bounds)."""
        return time.perf_counter() - self.start

    def wall_time(self) -> float:
        """Seconds of wall clock over every session of the run (a resumed run's earlier ones included)."""
        return self.wall_offset + self.elapsed()

    def budget_used(self) -> float:
        """The fraction of the budget spent, in ``[0, 1]``: of ``max_env_steps`` when set, else of the time limit.

        Env steps take precedence so that a run with a step budget does not depend on the machine's speed.
        """
        if self.config.max_env_steps is not None:
            return min(self.env_steps / self.config.max_env_steps, 1.0)
        return min(self.elapsed() / self.config.time_limit, 1.0)

    def should_stop(self) -> bool:
        """True once the time limit or the env-step budget is spent, an evaluation reached the target, or the
        run was interrupted."""
        if self.reached_target or self.interrupted:
            return True
        if self.config.max_env_steps is not None and self.env_steps >= self.config.max_env_steps:
            return True
        return self.elapsed() >= self.config.time_limit

    # ------------------------------------------------------------------ rows
    def record(self, env_steps: int, stats: dict[str, torch.Tensor | float]) -> None:
        """Ends one training iteration of ``env_steps`` new env steps with its statistics."""
        self.iteration += 1
        self.env_steps += env_steps
        row = {"iteration": self.iteration, "env_steps": self.env_steps, "wall_time_s": self.wall_time(), **stats}
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
        row = {"iteration": self.iteration, "env_steps": self.env_steps, "wall_time_s": self.wall_time(), **result}
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


    def poll_checkpoint(self, model: nn.Module, learner_state: Callable[[], dict[str, Any]]) -> None:
        """Writes the checkpoint (``model``'s weights, the counters, ``learner_state()``) when the iteration just
        recorded is a multiple of ``config.checkpoint_every``, with ``progress.csv`` written up to it first (a
        resumed run reads its rows back). The file is replaced atomically: a kill during the write leaves the
        previous checkpoint."""
        every = self.config.checkpoint_every
        if not every or self.iteration % every:
            return
        self.flush()
        eval_return = math.nan if self.last_eval is None else self.last_eval
        save_checkpoint(self.logdir / CHECKPOINT_NAME, self.algo, self.config, self.spec, model,
                        {"env_steps": self.env_steps, "iteration": self.iteration, "wall_time_s": self.wall_time(),
                         "eval_return": eval_return, "interrupted": False, "learner": learner_state()})


def _earlier_rows(resume: Resume) -> list[dict[str, Any]]:
    """The rows of ``progress.csv`` in the folder of ``resume``'s checkpoint up to its iteration (a copy of the
    file may hold later ones), as numbers; none when the file is gone."""
    path = resume.folder / Run.CSV_NAME
    if not path.is_file():
        log.warning("%s is missing: progress.csv of the resumed run starts at iteration %d", path, resume.iteration + 1)
        return []
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = {}
            for k, v in raw.items():
                if v in ("", None):
                    continue
                try:
                    row[k] = int(float(v)) if k in ("iteration", "env_steps") else float(v)
                except ValueError:
                    row[k] = v
            if row.get("iteration", 0) <= resume.iteration:
                rows.append(row)
    return rows


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


@contextlib.contextmanager
def training_run(
    algo: str, config: RunConfig, spec: EnvSpec, *, start: float, resume: Resume | None = None
) -> Iterator[tuple[Run, contextlib.ExitStack]]:
    """The frame of every ``train``: a :class:`Run`, and an exit stack that closes what the run opens.

    Sets ``torch`` to ``config.torch_threads`` threads (when set) and to ``config.matmul_precision`` for the run
    and restores the previous settings on exit; the run and everything pushed on the stack are closed on exit,
    in reverse order, whether training returned or raised.

    In the main thread, a first Ctrl-C (SIGINT) or SIGTERM (what ``timeout``, SLURM and ``docker stop`` send)
    during the run does not raise: it sets ``run.stop_signal`` (``run.interrupted``), so that the loop (``while not
    run.should_stop()``) ends after the iteration under way and :func:`finish_training` writes the checkpoint,
    the curve and the summary of what was reached, skipping the final evaluation. A second one raises:
    ``KeyboardInterrupt`` for SIGINT, ``SystemExit(143)`` for SIGTERM. The batchers' worker processes ignore
    SIGINT (a terminal sends it to the whole process group): closing them is this process's job, done by the
    stack. The previous handlers are restored on exit.

    Args:
        algo: the algorithm's name (the run's log folder and checkpoint say it).
        config: the validated config.
        spec: the env's description, from the algorithm's ``validate``.
        start: ``time.perf_counter()`` when ``train`` was called (validation counts in the wall time).
        resume: the checkpoint the run continues, from :func:`~rlstruct.algos.checkpoints.load_resume` (``None``: a
            fresh run); see :class:`Run`.

    Yields:
        ``(run, stack)``.
    """
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    run = Run(algo, config, spec, start=start, resume=resume)
    with contextlib.ExitStack() as stack:
        stack.callback(torch.set_num_threads, threads)
        stack.callback(torch.set_float32_matmul_precision, precision)
        torch.set_float32_matmul_precision(config.matmul_precision)
        stack.callback(run.close)
        stack.enter_context(_stop_on_signals(run))
        yield run, stack


@contextlib.contextmanager
def _stop_on_signals(run: Run) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield
        return

    def on_signal(signum: int, frame: Any) -> None:
        if run.interrupted:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        run.stop_signal = signal.Signals(signum).name

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


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
    agent_args = {"spec": spec, "hidden_sizes": tuple(config.hidden_sizes), "check_device": config.check_devices}
    env_args = {"name": config.env, "backend": config.backend, "max_episode_steps": spec.max_episode_steps,
                "physics_dtype": config.physics_dtype}
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
    cuda_graph: bool = False,
    zero_copy: bool = False,
    agent_kwargs: dict[str, Any] | None = None,
    model_kwargs: dict[str, Any] | None = None,
    seed: int | None = None,
) -> tuple[RL_Batcher, Evaluator]:
    """The training batcher and the :class:`Evaluator` of a run, both closed by ``stack``.

    Seeds are fixed per role (envs from offsets 0 and 1000, agents from 5000 and 6000) so that a run is
    reproducible from ``seed`` (``config.seed``, or the session's seed of a resumed run) alone; evaluation envs
    run one whole episode each (up to ``config.evaluation_max_steps``), ``config.evaluation_chunk_steps`` steps per
    acquisition: episodic envs, or, with ``cuda_graph`` and a CUDA ``evaluation_device``, auto-reset envs whose
    first episodes count, each acquisition replayed as a CUDA graph.

    Args:
        stack: the run's exit stack (see :func:`training_run`).
        config: the validated config.
        spec: the env's description.
        create_agent: the batchers' agent factory (module level, so it pickles), e.g. :func:`create_policy_agent`.
        n_timesteps: steps of every training env per ``execute``.
        autoreset: whether the training envs auto-reset.
        explore: the training ``agent_info``, one value per key, e.g. ``{"stochastic": True}``.
        greedy: the evaluation ``agent_info``, one value per key, e.g. ``{"epsilon": 0.0}``.
        cuda_graph: the training batcher's ``cuda_graph`` (see :class:`RL_Batcher`), and the evaluation batcher's
            where it runs on a GPU.
        zero_copy: the training batcher's ``zero_copy`` (its double buffer, to overlap collection and learning).
        agent_kwargs: more keyword arguments of ``create_agent`` for the training batcher's agent only (e.g. its
            ``autocast``); the evaluation's agent gets the shared ones.
        model_kwargs: more keyword arguments of ``create_agent`` for both batchers' agents: what their network is
            built with (e.g. ``normalize_observations``).
        seed: the seed of the envs and agents (``None``: ``config.seed``); pass ``run.seed``.

    Returns:
        ``(batcher, evaluator)``.
    """
    agent_args, env_args = worker_args(config, spec)
    agent_args.update(model_kwargs or {})
    seed = config.seed if seed is None else seed
    n_workers = max(config.n_processes, 1)
    batcher = RL_Batcher(
        n_timesteps, create_agent, {**agent_args, **(agent_kwargs or {}), "device": config.batcher_device},
        create_env, {**env_args, "n_envs": config.n_envs, "autoreset": autoreset, "device": config.batcher_device},
        config.n_processes, worker_seeds(seed, n_workers, 0),
        agent_info=DictTensor({k: torch.tensor([v]) for k, v in explore.items()}),
        agent_seeds=worker_seeds(seed, n_workers, 5000), device=config.batcher_device,
        cuda_graph=cuda_graph, zero_copy=zero_copy, timeout=config.batcher_timeout,
    )
    stack.callback(batcher.close)
    n_eval_workers = max(config.n_evaluation_processes, 1)
    eval_steps = spec.max_episode_steps
    if config.evaluation_max_steps is not None:
        eval_steps = min(eval_steps, config.evaluation_max_steps)
    chunk = min(eval_steps, config.evaluation_chunk_steps)
    # On a GPU, an episodic evaluation is hundreds of eager steps, each many small launches and a host sync (the
    # running set): with cuda_graph, the evaluation envs auto-reset and each chunk is one graph replay; the
    # Evaluator counts every env's first episode, the one the episodic envs would have run.
    eval_graph = cuda_graph and as_device(config.evaluation_device).type == "cuda"
    eval_batcher = RL_Batcher(
        chunk, create_agent, {**agent_args, "device": config.evaluation_device},
        create_env, {**env_args, "n_envs": config.n_evaluation_envs, "autoreset": eval_graph,
                     "device": config.evaluation_device},
        config.n_evaluation_processes, worker_seeds(seed, n_eval_workers, 1000),
        agent_info=DictTensor({k: torch.tensor([v]) for k, v in greedy.items()}),
        agent_seeds=worker_seeds(seed, n_eval_workers, 6000), device=config.evaluation_device,
        cuda_graph=eval_graph, timeout=config.batcher_timeout,
    )
    n_eval = eval_batcher.n_elems()
    evaluator = Evaluator(eval_batcher, DictTensor({k: torch.full((n_eval,), v) for k, v in greedy.items()}),
                          config.eval_every, max_steps=eval_steps)
    stack.callback(evaluator.close)
    return batcher, evaluator


def finish_training(run: Run, evaluator: Evaluator, model: nn.Module, spec: EnvSpec, *, title: str,
                    learner: dict[str, Any] | None = None) -> TrainResult:
    """The end of every ``train``: final evaluation, checkpoint, learning curve, ``summary.json`` and result.

    The checkpoint holds ``model``'s weights, the counters (``iteration``, ``env_steps``, ``wall_time_s`` over every
    session) and ``learner``, what a resumed run restores (see
    :func:`~rlstruct.algos.checkpoints.load_resume`).

    Where an evaluation reached the target return, the weights it evaluated are the ones kept (not those of
    the iterations since they were sent); otherwise the final weights are evaluated again on fresh episodes.
    An interrupted run (``run.interrupted``) skips that final evaluation: it keeps an evaluation that has
    already finished, if any, and its result's ``eval_return`` is the last evaluation's (nan if none).

    Args:
        run: the run, still open (this closes it).
        evaluator: the run's evaluator.
        model: the learner's model.
        spec: the env's description.
        title: the algorithm's name in the plot's title, e.g. ``"A2C"``.
        learner: the learner's state at the end of training besides ``model``'s weights (``{"optimizer":
            optimizer.state_dict(), ...}``: plain types and tensors, copied to the CPU).
    """
    config = run.config
    interrupted = run.interrupted
    if run.iteration == 0 and not interrupted:
        log.warning("no training iteration ran: the time limit (%g s) was spent before the first one (setup, "
                    "compilation, the first evaluation); what follows evaluates the untrained policy. Raise "
                    "--time-limit", config.time_limit)
    if run.reached_target:
        model.load_state_dict(evaluator.evaluated_weights)
    if interrupted:
        finished = evaluator.collect()
        if finished is not None:
            run.record_eval(finished)
        eval_return = math.nan if run.last_eval is None else run.last_eval
    else:
        previous, final = evaluator.final(cpu_state_dict(model), run.iteration, run.env_steps)
        if previous is not None:
            run.record_eval(previous)
        run.record_eval(final)
        eval_return = final["eval/return"]
    wall = run.elapsed()
    run.close()
    checkpoint = save_checkpoint(run.logdir / CHECKPOINT_NAME, run.algo, config, spec, model,
                                 {"env_steps": run.env_steps, "iteration": run.iteration,
                                  "wall_time_s": run.wall_offset + wall, "eval_return": eval_return,
                                  "interrupted": interrupted, "learner": learner or {}})
    suffix = ", interrupted" if interrupted else ""
    plot = plot_learning_curve(run.history, run.logdir / "learning_curve.png",
                               f"{title} on {config.env} ({config.backend}), seed {config.seed}{suffix}")
    result = TrainResult(eval_return, run.env_steps, wall, run.history, str(run.logdir), run.iteration,
                         checkpoint, plot, run.target_return, run.reached_target, interrupted, run.stop_signal)
    with open(run.logdir / Run.SUMMARY_NAME, "w") as f:
        json.dump(result.summary(), f, indent=2)
    return result
