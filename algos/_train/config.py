"""The settings every algorithm shares (:class:`RunConfig`, which each algorithm's config extends) and their checks.

:func:`validate_run_config` checks them once, at the public boundary (the command line or ``train``), before
anything is built.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from typing import Any

from rlstruct.devices import check_device_exists
from rlstruct.envs.factory import BACKENDS, resolve_backend
from rlstruct.errors import ConfigError, MissingDependencyError

__all__ = ["MATMUL_PRECISIONS", "EVALUATION_POLICIES", "RunConfig", "validate_run_config", "check_evaluation_policy",
           "check_env_kwargs", "check_physics_dtype"]

#: the values of ``RunConfig.matmul_precision`` (torch's ``set_float32_matmul_precision``)
MATMUL_PRECISIONS = ("highest", "high", "medium")
#: ``evaluation_policy``'s values: the policy's mode (argmax), or its draws as in training at its end
EVALUATION_POLICIES = ("greedy", "sample")


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
        ray_actors: run the training batcher as this many Ray actors (rlstruct.batchers.RayBatcher), each hosting
            n_processes workers of n_envs envs, its rows collected into this process (0: no Ray); the evaluation stays
            here. The ray extra installs Ray.
        ray_address: the Ray cluster the actors join: auto (the one ray start runs on this node) or ray://HOST:PORT;
            None starts a local cluster for the run (under torchrun, start one with ray start --head and pass auto,
            so that the ranks share it).
        max_episode_steps: episode time limit (truncation); None keeps the env's own.
        physics_dtype: float64 (gymnasium's doubles) or float32 (half the state traffic: throughput on a GPU), the
            physics precision of rlstruct's torch simulators (the torch backend only).
        env_kwargs: keyword arguments of the backend's env constructor for the training envs, as a JSON object on the
            command line: gymnasium.make's (e.g. {"continuous": true} for LunarLander-v3), ale-py AtariVectorEnv's
            (e.g. {"life_loss_info": true, "repeat_action_probability": 0.25}), envpool's, the torch simulators'.
        learner_device: where the model, the loss and the optimizer (and a replay buffer) live.
        batcher_device: where the training batcher's envs, agents and buffer live.
        evaluation_device: where the evaluation batcher's envs, agent and buffer live.
        seed: seeds the networks, the envs and the agents.
        time_limit: stop training after this many seconds of wall clock (setup included); the evaluation under way
            and the final one still run to their end (bound them with evaluation_max_steps, n_evaluation_envs). It
            only stops a run: no schedule reads the clock.
        max_env_steps: the step budget: stop training after this many training env steps (None: no limit); the
            schedules (a learning rate annealed to 0) run over it.
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
            counts this process's clock, and progress.csv in logdir gets the new
            rows after the earlier ones. The envs start fresh episodes with seeds drawn from seed and the iteration
            resumed at. The settings that shape the networks or the data (env, backend, hidden_sizes, ...) must
            equal the checkpoint's.
        checkpoint_every: also write the checkpoint every this many training iterations (0: only at the end and on
            Ctrl-C or SIGTERM), so that a run killed outright (SIGKILL, a lost node) can be resumed from the last one;
            each costs a host sync and a copy of the learner's state to the CPU.
        restart_workers: replace a batcher worker process that dies, raises or hangs, this many times in all (0: the
            first failure stops the run); its rows of the acquisition under way are collected again by the new
            worker, so no step of a dead worker reaches the learner, and progress.csv gets a batcher/restarts column.
        evaluation_policy: how evaluation episodes act: greedy (the policy's mode, DQN's argmax) or sample (as in
            training at its end: actor-critics and SAC draw from their distribution, DQN acts epsilon-greedy with
            epsilon_end). Sample is Atari's protocol, where a greedy policy can stall (never pressing FIRE after a
            lost life) and a whole game then runs to the 27,000-step cap; videos and rlstruct eval follow the run's.
        evaluation_env_kwargs: keyword arguments of the evaluation envs' constructor, over env_kwargs; None:
            env_kwargs less what shapes training only, so that evaluations report the game's score (ale-py's
            episodic_life, life_loss_info and reward_clipping are off: whole games with unclipped rewards).
        video_every: record one evaluation episode into logdir/videos/ after every this many evaluations (mp4 with
            imageio-ffmpeg, else gif), with the weights the loop holds when that evaluation ends, and one of the final
            policy (0: no videos); the env's backend must render (torch, gymnasium, ale).
        preset: the tuned settings applied to the fields not given (rlstruct presets lists them): auto (the preset
            of the algorithm and env, if there is one), none (the bare defaults), or a preset's name; a run records
            the one it used (none when no preset applied).
    """

    env: str = "CartPole-v1"
    backend: str = "auto"
    n_envs: int = 16
    n_processes: int = 0
    ray_actors: int = 0
    ray_address: str | None = None
    max_episode_steps: int | None = None
    physics_dtype: str = "float64"
    env_kwargs: dict[str, Any] | None = None
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
    evaluation_env_kwargs: dict[str, Any] | None = None
    evaluation_policy: str = "greedy"
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
    restart_workers: int = 0
    video_every: int = 0
    preset: str = "auto"

    def __new__(cls, *args: Any, **kwargs: Any) -> RunConfig:
        """A config that remembers which fields its constructor was given: a preset fills the others
        (:func:`rlstruct.algos._train.presets.given_fields`)."""
        self = super().__new__(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        self._given = frozenset(names[: len(args)]) | frozenset(kwargs)
        return self

    #: the ``--help`` group of each field (see :func:`rlstruct.algos._train.flags.help_groups`)
    HELP_GROUPS = {
        **dict.fromkeys(("env", "backend", "n_envs", "n_processes", "ray_actors", "ray_address", "max_episode_steps",
                         "physics_dtype", "env_kwargs"), "environment"),
        **dict.fromkeys(("seed", "time_limit", "max_env_steps", "target_return", "stop_at_reward_threshold",
                         "hidden_sizes", "lr", "learner_device", "batcher_device", "logdir", "log_every", "progress",
                         "tensorboard", "check_devices", "torch_threads", "batcher_timeout", "matmul_precision",
                         "restart_workers", "preset"),
                        "run"),
        **dict.fromkeys(("evaluation_device", "n_evaluation_envs", "n_evaluation_processes", "evaluation_max_steps",
                         "evaluation_chunk_steps", "evaluation_env_kwargs", "evaluation_policy", "eval_every",
                         "video_every"),
                        "evaluation"),
        **dict.fromkeys(("resume", "checkpoint_every"), "checkpoints"),
    }

    def to_dict(self) -> dict[str, Any]:
        """The config as plain Python types (tuples become lists), for JSON and checkpoints."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def validate_run_config(config: RunConfig) -> None:
    """Checks the shared settings before anything is built.

    Raises:
        DeviceUnavailableError: a device does not exist here (the message names the devices that do).
        ConfigError: anneal_lr without a step budget; ray_address without ray_actors.
        MissingDependencyError: ray_actors without Ray installed.
        ValueError: a setting is out of range.
    """
    if config.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {config.backend!r}")
    for name in ("n_envs", "n_evaluation_envs", "evaluation_chunk_steps", "eval_every", "log_every"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)!r}")
    for name in ("n_processes", "ray_actors", "n_evaluation_processes", "torch_threads", "checkpoint_every",
                 "restart_workers"):
        if getattr(config, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(config, name)!r}")
    if not 0 <= config.seed < 2**31:
        raise ValueError(f"seed must be an int in [0, 2**31), got {config.seed!r}; pass e.g. --seed 0")
    if not config.lr > 0:
        raise ValueError(f"lr must be > 0, got {config.lr!r}; pass e.g. --lr 3e-4")
    check_physics_dtype(config.physics_dtype, config.env, config.backend)
    for name in ("env_kwargs", "evaluation_env_kwargs"):
        check_env_kwargs(getattr(config, name), argument=name)
    check_evaluation_policy(config.evaluation_policy)
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
    if getattr(config, "anneal_lr", False) and config.max_env_steps is None:
        raise ConfigError(
            "anneal_lr decays the learning rate over the step budget max_env_steps, got max_env_steps=None; pass "
            "--max-env-steps N (e.g. 500000), or --no-anneal-lr for a constant learning rate"
        )
    for name in ("learner_device", "batcher_device", "evaluation_device"):
        check_device_exists(getattr(config, name), argument=name)
    if config.ray_actors and importlib.util.find_spec("ray") is None:
        raise MissingDependencyError(f"ray_actors={config.ray_actors} runs the training batcher on Ray, which is not "
                                     "installed here; pip install 'rlstruct[ray]', or drop --ray-actors")
    if config.ray_address is not None and not config.ray_actors:
        raise ConfigError(f"ray_address={config.ray_address!r} names a Ray cluster for the training batcher's actors, "
                          "got ray_actors=0; pass --ray-actors N too, or drop --ray-address")


def check_evaluation_policy(policy: Any, *, argument: str = "evaluation_policy") -> str:
    """Returns ``policy`` if it is one of :data:`EVALUATION_POLICIES`.

    Raises:
        ValueError: it is not; the message names ``argument``.

    >>> check_evaluation_policy("sample")
    'sample'
    """
    if policy not in EVALUATION_POLICIES:
        raise ValueError(
            f"{argument} must be one of {list(EVALUATION_POLICIES)}, got {policy!r}; pass sample to evaluate the "
            "policy as it acts in training (Atari's protocol), or greedy for its mode"
        )
    return policy


def check_env_kwargs(kwargs: Any, *, argument: str = "env_kwargs") -> None:
    """Checks an ``env_kwargs`` setting: ``None``, or a dict of keyword arguments (str keys) whose values JSON
    records (``config.json`` and the checkpoint keep them).

    >>> check_env_kwargs({"episodic_life": True})
    >>> check_env_kwargs(["episodic_life"])
    Traceback (most recent call last):
    ...
    ValueError: env_kwargs must be a dict of keyword arguments or None, got list ['episodic_life']; pass e.g. \
--env-kwargs '{"episodic_life": true}' (a JSON object), or env_kwargs={"episodic_life": True} in Python
    """
    if kwargs is None:
        return
    fix = (f"pass e.g. --{argument.replace('_', '-')} '{{\"episodic_life\": true}}' (a JSON object), or "
           f"{argument}={{\"episodic_life\": True}} in Python")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        raise ValueError(f"{argument} must be a dict of keyword arguments or None, got {type(kwargs).__name__} "
                         f"{kwargs!r}; {fix}")
    try:
        json.dumps(kwargs, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{argument} must hold JSON values (numbers, strings, booleans, null, lists, objects: "
                         f"config.json records them), got {kwargs!r} ({e}); {fix}") from None


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
