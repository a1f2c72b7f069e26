"""The settings of a run, typed by family: :class:`RunConfig` (what every algorithm shares), :class:`OnPolicyConfig`
and :class:`OffPolicyConfig` (what each training loop reads), which each algorithm's config extends. An on-policy
algorithm's config is composed of the parts its loop reads besides: :class:`RolloutPart` (a collection of ``n_steps``
steps of auto-reset envs), :class:`MinibatchPart` (epochs of minibatches over it), :class:`ActorCriticPart` (the
actor-critic's policy), :class:`RecurrentPart` (its LSTM) and :class:`AdvantagePart` (its GAE advantages and loss
weights). :class:`FastPathPart` (the compiled update, autocast, the shared weights) and :class:`CapturedPart` (the
captured acquisition) are the fast path's, which DQN takes too; an algorithm takes only the parts it uses, so that it
has no flag it must refuse.

Every field is declared with :func:`setting`: its default, the one-line help ``--help`` shows and its ``--help``
group sit beside it; a subclass changes a default with :func:`default`, which keeps the field's help and group. The
longer story of each setting is docs/concepts/settings.md.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from typing import Any, ClassVar

import torch

from rlstruct._accel import accelerator_for
from rlstruct.algos._train.finite import check_finite_settings
from rlstruct.algos._train.flags import declared
from rlstruct.algos._train.seeds import check_seeds
from rlstruct.algos._train.trackers import check_trackers
from rlstruct.devices import check_device_exists
from rlstruct.envs.factory import BACKENDS, resolve_backend
from rlstruct.errors import ConfigError, MissingDependencyError

__all__ = ["MATMUL_PRECISIONS", "EVALUATION_POLICIES", "AUTOCAST_VALUES", "setting", "default", "RunConfig",
           "AutocastPart", "FastPathPart", "CapturedPart", "OnPolicyConfig", "RolloutPart", "MinibatchPart",
           "ActorCriticPart", "RecurrentPart", "AdvantagePart", "OffPolicyConfig", "resume_fields", "check_bounds",
           "validate_run_config", "check_autocast", "check_fast_path", "check_on_policy", "check_off_policy",
           "check_evaluation_policy", "check_env_kwargs", "check_physics_dtype", "set_torch_threads",
           "training_workers"]

#: the values of ``RunConfig.matmul_precision`` (torch's ``set_float32_matmul_precision``)
MATMUL_PRECISIONS = ("highest", "high", "medium")
#: ``evaluation_policy``'s values: the policy's mode (argmax), or its draws as in training at its end
EVALUATION_POLICIES = ("greedy", "sample")
#: ``OnPolicyConfig.autocast``'s values
AUTOCAST_VALUES = ("none", "bfloat16")


def setting(default: Any, help: str, *, group: str | None = None, least: float | None = None,
            within: str | None = None, choices: tuple[str, ...] | None = None) -> Any:
    """A config field: its ``default``, its ``--help`` text (plain, one clause), its ``--help`` ``group`` and the
    values it takes, which :func:`check_bounds` checks before a run starts: at ``least`` a bound, ``within`` an
    interval of ``[0, 1]`` (``"[0, 1]"``, or ``"(0, 1]"`` without 0), or one of ``choices``; ``None`` passes.

    A field without a group is the algorithm's own, or, when it re-declares a base class's field with another
    default, in that field's group.

    >>> @dataclasses.dataclass
    ... class Config:
    ...     lr: float = setting(1e-3, "Adam learning rate", group="run")
    >>> dataclasses.fields(Config)[0].metadata["help"], Config().lr
    ('Adam learning rate', 0.001)
    """
    if within not in (None, "[0, 1]", "(0, 1]"):
        raise ValueError(f"within must be '[0, 1]', '(0, 1]' or None, got {within!r}")
    return dataclasses.field(default=default, metadata={"help": help, "group": group, "least": least,
                                                        "within": within, "choices": choices})


def default(value: Any) -> Any:
    """A field of a base class re-declared with another default ``value``; its help and group stay the base's
    (``--help`` shows the new default beside the help).

    >>> from rlstruct.algos._train.flags import field_help
    >>> @dataclasses.dataclass
    ... class Config(RunConfig):
    ...     lr: float = default(3e-4)
    >>> Config().lr, field_help(Config)["lr"]
    (0.0003, ('Adam learning rate', 'run'))
    """
    return dataclasses.field(default=value, metadata={"help": None, "group": None})


@dataclasses.dataclass
class RunConfig:
    """Settings every algorithm shares: environment, devices, budget, evaluation, logs and checkpoints."""

    env: str = setting("CartPole-v1", "gymnasium id of the environment, e.g. CartPole-v1 or Acrobot-v1",
                       group="environment")
    backend: str = setting("auto", "env backend: auto, torch, gymnasium, envpool, ale, gymnax, mjx, mujoco_torch or "
                                   "brax", group="environment")
    n_envs: int = setting(16, "training environments in all, split evenly over the worker processes",
                          group="environment", least=1)
    n_processes: int = setting(0, "training worker processes (0: the envs step in this process)",
                               group="environment", least=0)
    ray_actors: int = setting(0, "run the training batcher as this many Ray actors (0: no Ray)", group="environment",
                              least=0)
    ray_address: str | None = setting(None, "the Ray cluster the actors join: auto or ray://HOST:PORT (None: a "
                                            "local one)", group="environment")
    max_episode_steps: int | None = setting(None, "episode time limit (None: the env's own)", group="environment")
    physics_dtype: str = setting("float64", "precision of the torch simulators' physics: float64 or float32",
                                 group="environment")
    env_kwargs: dict[str, Any] | None = setting(None, "keyword arguments of the training envs' constructor, a JSON "
                                                      "object", group="environment")
    learner_device: str = setting("cpu", "device of the model, the loss, the optimizer and a replay buffer",
                                  group="run")
    batcher_device: str = setting("cpu", "device of the training batcher's envs, agents and buffer", group="run")
    evaluation_device: str = setting("cpu", "device of the evaluation batcher's envs, agent and buffer",
                                     group="evaluation")
    seed: int = setting(0, "seeds the networks, the envs and the agents", group="run")
    seeds: tuple[int, ...] | None = setting(None, "seeds trained as one population in this process, each a run "
                                                  "of LOGDIR/seed-S", group="run")
    time_limit: float | None = setting(None, "stop training after this many seconds of wall clock (None: no limit; "
                                             "the step budget ends a run)", group="run")
    max_env_steps: int | None = setting(None, "the step budget: stop after this many env steps (None: no limit)",
                                        group="run")
    target_return: float | None = setting(None, "stop once an evaluation and its confirmation on fresh episodes "
                                          "reach this mean return", group="run")
    stop_at_reward_threshold: bool = setting(True, "without target_return, stop at the preset's target, else the "
                                             "env's reward_threshold (false: spend the budget)", group="run")
    hidden_sizes: tuple[int, ...] = setting((64, 64), "hidden layer widths of the networks", group="run")
    network: str | None = setting(None, "MODULE:CALLABLE, a factory called with the env's EnvSpec that returns the "
                                        "model (None: the built-in networks)", group="run")
    lr: float = setting(1e-3, "Adam learning rate", group="run")
    adam_eps: float = setting(1e-8, "Adam's epsilon (SB3's and CleanRL's PPO: 1e-5)", group="run", least=0.0)
    n_evaluation_envs: int = setting(16, "episodes per evaluation", group="evaluation", least=1)
    final_evaluation_episodes: int | None = setting(None, "final evaluation episodes (None: n_evaluation_envs)",
                                                    group="evaluation", least=1)
    n_evaluation_processes: int = setting(0, "evaluation worker processes (0: evaluate in this process)",
                                          group="evaluation", least=0)
    evaluation_max_steps: int | None = setting(None, "steps per evaluation episode at most (None: the time limit)",
                                               group="evaluation")
    evaluation_chunk_steps: int = setting(256, "steps per acquisition of the evaluation batcher",
                                          group="evaluation", least=1)
    evaluation_env_kwargs: dict[str, Any] | None = setting(None, "the evaluation envs' keyword arguments, over "
                                                                 "env_kwargs (a JSON object)", group="evaluation")
    evaluation_policy: str = setting("greedy", "greedy (the policy's mode) or sample (as in training)",
                                     group="evaluation")
    eval_every: int = setting(50, "training iterations between two evaluations", group="evaluation", least=1)
    logdir: str | None = setting(None, "folder of the run's files (None: runs/ALGO-ENV-SEED); one "
                                 "holding a run gives FOLDER-2, FOLDER-3 and so on", group="run")
    log_every: int = setting(10, "iterations between two TensorBoard and progress-bar updates", group="run", least=1)
    progress: bool = setting(True, "show a progress bar on stderr", group="run")
    tensorboard: bool = setting(True, "write TensorBoard event files into logdir", group="run")
    track: str | None = setting(None, "also log to experiment trackers: mlflow, wandb, trackio (comma-separated)",
                                group="run")
    check_devices: bool = setting(False, "check the device of every tensor an agent or the learner sees (slow)",
                                  group="run")
    torch_threads: int = setting(1, "torch threads of the learner process (0: torch's default)", group="run", least=0)
    batcher_timeout: float = setting(120.0, "seconds a batcher waits for a worker before it fails the run",
                                     group="run")
    start_timeout: float | None = setting(None, "seconds a batcher's start may take: workers spawned, envs and "
                                                "agents built (None: max(batcher_timeout, 120))", group="run")
    matmul_precision: str = setting("highest", "float32 matrix products: highest, high (TF32) or medium",
                                    group="run")
    deterministic: bool = setting(False, "the same seed gives the same bits on one device: deterministic kernels "
                                         "and cuBLAS workspace (slower on a GPU)", group="run")
    resume: str | None = setting(None, "a checkpoint.pt, or a run's log folder, to continue training from",
                                 group="checkpoints")
    checkpoint_every: int = setting(0, "also write the checkpoint every this many iterations (0: at the end only)",
                                    group="checkpoints", least=0)
    restart_workers: int = setting(0, "replace a worker that dies or hangs, this many times in all", group="run",
                                   least=0)
    video_every: int = setting(0, "record an evaluation episode after every this many evaluations (0: no videos)",
                               group="evaluation")
    preset: str = setting("auto", "tuned settings for the fields not given: auto, none, or a preset's name",
                          group="run")

    #: the settings a resumed run must share with its checkpoint, as they shape the networks or the data (see
    #: load_resume); a family, a part or an algorithm names its own, and resume_fields gathers them all
    RESUME_FIELDS: ClassVar[tuple[str, ...]] = ("env", "backend", "max_episode_steps", "hidden_sizes", "env_kwargs",
                                                "network")

    def to_dict(self) -> dict[str, Any]:
        """The config as plain Python types (tuples become lists), for JSON and checkpoints."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


@dataclasses.dataclass
class AutocastPart:
    """The forward passes in a lower precision: the update's forwards and the training agent's under
    ``torch.autocast``, the losses and what the agent returns in float32 (A2C, PPO, REINFORCE, PQN, DQN)."""

    autocast: str = setting("none", "none, or bfloat16: the update's and the policy's forward under autocast",
                            group="fast path")


@dataclasses.dataclass
class FastPathPart(AutocastPart):
    """The learner's fast path on one device (A2C, PPO, REINFORCE, PQN, DQN): the update compiled, its forwards under
    autocast, and an in-process training batcher on the learner's device that reads the learner's weights there."""

    compile_update: bool = setting(False, "compile the update's forward and loss with torch.compile",
                                   group="fast path")
    share_weights: bool = setting(True, "the in-process batcher reads the learner's weights on its device",
                                  group="fast path")


@dataclasses.dataclass
class CapturedPart:
    """A training batcher of auto-reset envs whose acquisitions a CUDA graph can replay (A2C, PPO, PQN, DQN; not
    REINFORCE, whose episodes end at different steps)."""

    cuda_graph: bool = setting(False, "replay each acquisition as one CUDA graph (a CUDA batcher_device)",
                               group="fast path")


@dataclasses.dataclass
class OnPolicyConfig(FastPathPart, RunConfig):
    """What the on-policy loop reads of every member (A2C, PPO, REINFORCE, PQN): the schedule, the return
    normalisation and the update's fast path. A member's config adds the parts its collection and its policy read
    (:class:`RolloutPart`, :class:`ActorCriticPart`, :class:`RecurrentPart`)."""

    n_envs: int = default(32)
    max_env_steps: int | None = setting(500_000, "the step budget, over which anneal_lr decays")
    lr: float = default(3e-3)
    gamma: float = setting(0.99, "discount factor", group="on-policy", within="[0, 1]")
    anneal_lr: bool = setting(True, "decay the learning rate linearly to 0 over max_env_steps", group="on-policy")
    normalize_rewards: bool = setting(False, "divide rewards by the running std of their discounted return",
                                      group="normalisation")
    normalize_rewards_gamma: float | None = setting(None, "the discount of that return (None: gamma; SB3's "
                                                    "VecNormalize: 0.99)", group="normalisation", within="[0, 1]")
    RESUME_FIELDS: ClassVar[tuple[str, ...]] = ("normalize_rewards",)


@dataclasses.dataclass
class RolloutPart(CapturedPart):
    """The collection of an on-policy algorithm that steps auto-reset envs ``n_steps`` at a time (A2C, PPO, PQN),
    not whole episodes (REINFORCE)."""

    n_steps: int = setting(8, "steps of every env per collection (auto-reset envs)", group="on-policy", least=1)
    overlap: bool = setting(False, "collect the next batch while learning on this one (data one update stale)",
                            group="on-policy")


@dataclasses.dataclass
class MinibatchPart(RolloutPart):
    """A collection learned from in ``n_epochs`` passes of ``n_minibatches`` shuffled minibatches, each one gradient
    step (PPO, PQN)."""

    n_epochs: int = setting(4, "passes over each collection", least=1)
    n_minibatches: int = setting(2, "shuffled minibatches per pass, each one gradient step", least=1)


@dataclasses.dataclass
class ActorCriticPart:
    """The policy of an actor-critic (A2C, PPO, REINFORCE): its network's options, its observation normaliser and
    its compiled step."""

    activation: str = setting("tanh", "hidden activation of the actor-critic's MLPs: tanh or relu", group="run",
                              choices=("tanh", "relu"))
    log_std_init: float = setting(0.0, "initial log standard deviation of a Gaussian policy (continuous actions)",
                                  group="run")
    ortho_init: bool = setting(True, "orthogonal initial weights of the MLPs (false: torch's default init)",
                               group="run")
    normalize_observations: bool = setting(False, "standardise observations by their running statistics",
                                           group="normalisation")
    obs_stats_after_update: bool = setting(False, "merge observations into the statistics after the update, "
                                           "which starts from the acting policy", group="normalisation")
    compile_policy: bool = setting(False, "compile the training batcher's policy step with torch.compile",
                                   group="fast path")

    RESUME_FIELDS: ClassVar[tuple[str, ...]] = ("activation", "normalize_observations")


@dataclasses.dataclass
class RecurrentPart(ActorCriticPart):
    """An actor-critic whose policy may be an LSTM, its memory carried by the batcher from one collection to the
    next (A2C, PPO)."""

    recurrent: bool = setting(False, "an LSTM policy whose memory the batcher carries between collections",
                              group="on-policy")

    RESUME_FIELDS: ClassVar[tuple[str, ...]] = ("recurrent",)


@dataclasses.dataclass
class AdvantagePart:
    """The GAE(lambda) advantages of an actor-critic's collection and the weights of its loss (A2C, PPO)."""

    gae_lambda: float = setting(0.95, "GAE lambda (1: Monte-Carlo advantages, 0: one-step TD errors)",
                                within="[0, 1]")
    value_coef: float = setting(0.5, "weight of the value loss")
    entropy_coef: float = setting(0.0, "weight of the entropy bonus")
    normalize_advantages: bool = setting(True, "standardise the advantages within each batch the loss sees")
    reward_scale: float = setting(0.1, "multiply rewards by this in the loss")


@dataclasses.dataclass
class OffPolicyConfig(RunConfig):
    """What the off-policy loop reads (DQN, SAC): the collection, the replay buffer and when learning starts."""

    n_envs: int = default(4)
    hidden_sizes: tuple[int, ...] = default((128, 128))
    eval_every: int = default(25)
    rollout_steps: int = setting(16, "steps of every env per acquisition", group="off-policy", least=1)
    buffer_size: int = setting(50_000, "transitions the replay buffer holds", group="off-policy", least=1)
    batch_size: int = setting(64, "transitions per gradient step", group="off-policy", least=1)
    learning_starts: int = setting(1_000, "env steps collected before the first gradient step", group="off-policy",
                                   least=0)
    gamma: float = setting(0.99, "discount factor", group="off-policy", within="[0, 1]")
    replay_storage: str = setting("memory", "where the replay buffer lives: memory, or disk (memory-mapped files in "
                                            "the log folder, for buffers beyond RAM)", group="off-policy",
                                  choices=("memory", "disk"))
    prioritized_replay: bool = setting(False, "prioritized replay (Schaul et al. 2016, proportional to the TD "
                                              "errors)", group="off-policy")
    priority_alpha: float = setting(0.6, "prioritized replay: how much the priorities shape the draws (0: uniform)",
                                    group="off-policy")
    priority_beta0: float = setting(0.4, "prioritized replay: importance-sampling exponent at the start, annealed "
                                         "to 1 over the step budget", group="off-policy")


def resume_fields(config_cls: type) -> tuple[str, ...]:
    """The settings a resumed run of ``config_cls`` must share with its checkpoint: the ``RESUME_FIELDS`` of every
    class it is made of (its family's, its parts', its own), each once.

    >>> resume_fields(OnPolicyConfig)
    ('env', 'backend', 'max_episode_steps', 'hidden_sizes', 'env_kwargs', 'network', 'normalize_rewards')
    """
    names: dict[str, None] = {}
    for klass in reversed(config_cls.__mro__):
        names.update(dict.fromkeys(vars(klass).get("RESUME_FIELDS", ())))
    return tuple(names)


def check_bounds(config: Any) -> None:
    """Raises ``ValueError`` naming the first setting of ``config`` (a config dataclass) whose value breaks what its
    :func:`setting` declares (``least``, ``within``, ``choices``; a field re-declared with :func:`default` keeps its
    base's); a ``None`` value passes.

    >>> check_bounds(OnPolicyConfig(n_envs=0))
    Traceback (most recent call last):
    ...
    ValueError: n_envs must be >= 1, got 0
    >>> check_bounds(OffPolicyConfig(replay_storage="tape"))
    Traceback (most recent call last):
    ...
    ValueError: replay_storage must be 'memory' or 'disk', got 'tape'
    """
    config_cls = type(config)
    least, within, choices = (declared(config_cls, key) for key in ("least", "within", "choices"))
    for f in dataclasses.fields(config):
        name, value = f.name, getattr(config, f.name)
        if value is None:
            continue
        if least[name] is not None and value < least[name]:
            raise ValueError(f"{name} must be >= {least[name]}, got {value!r}")
        if within[name] is not None and not (0 <= value <= 1 if within[name][0] == "[" else 0 < value <= 1):
            raise ValueError(f"{name} must lie in {within[name]}, got {value!r}")
        if choices[name] is not None and value not in choices[name]:
            raise ValueError(f"{name} must be {' or '.join(map(repr, choices[name]))}, got {value!r}")


def training_workers(config: RunConfig) -> int:
    """The training batcher's workers, over which its ``n_envs`` envs are split: ``max(n_processes, 1)`` per Ray
    actor.

    >>> training_workers(RunConfig(n_processes=2, ray_actors=3)), training_workers(RunConfig())
    (6, 1)
    """
    return max(config.n_processes, 1) * max(config.ray_actors, 1)


def set_torch_threads(n: int) -> int:
    """Sets torch's intra-op threads to ``n``, what a run's ``torch_threads`` means (0: torch's count is left as it
    is); returns the count before, which ``set_torch_threads(previous)`` restores. A call that changes nothing costs
    nothing.

    >>> previous = set_torch_threads(1)
    >>> torch.get_num_threads(), set_torch_threads(previous)
    (1, 1)
    """
    previous = torch.get_num_threads()
    if n and n != previous:
        torch.set_num_threads(n)
    return previous


def validate_run_config(config: RunConfig) -> None:
    """Checks the shared settings before anything is built.

    Raises:
        DeviceUnavailableError: a device does not exist here (the message names the devices that do).
        ConfigError: ray_address without ray_actors, or n_envs not a multiple of the training workers.
        MissingDependencyError: ray_actors without Ray installed, or a tracker of ``track`` without its library.
        ValueError: a setting is out of range, or a float setting (of any family or algorithm) is NaN or infinite.
    """
    check_finite_settings(config)
    if config.seeds is not None:
        check_seeds(config.seeds)
    if config.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {config.backend!r}")
    check_bounds(config)
    workers = training_workers(config)
    if config.seeds is not None:  # a population's batcher splits its members' envs together over its workers
        members = len(config.seeds)
        if members * config.n_envs % workers:
            raise ConfigError(
                f"a population's {members} x n_envs training envs are split evenly over its {workers} training "
                f"workers (max(n_processes, 1)), got --n-envs {config.n_envs} ({members * config.n_envs} envs); pass "
                f"--n-envs {config.n_envs} with --n-processes {math.gcd(members * config.n_envs, workers)}, or an "
                f"--n-envs that makes {members} x n_envs a multiple of {workers}"
            )
    elif config.n_envs % workers:
        raise ConfigError(
            f"n_envs is the training envs in all, split evenly over the {workers} training workers (max(n_processes, "
            f"1) * max(ray_actors, 1)), got --n-envs {config.n_envs}; pass a multiple of {workers}, e.g. --n-envs "
            f"{workers * max(config.n_envs // workers, 1)}"
        )
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
    for name in ("time_limit", "batcher_timeout", "start_timeout"):
        if getattr(config, name) is not None and not getattr(config, name) > 0:
            raise ValueError(f"{name} must be > 0 seconds, got {getattr(config, name)!r}")
    for name in ("max_env_steps", "evaluation_max_steps"):
        if getattr(config, name) is not None and getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {getattr(config, name)!r}")
    if not config.hidden_sizes or min(config.hidden_sizes) < 1:
        raise ValueError(f"hidden_sizes must be one or more positive widths, got {config.hidden_sizes!r}")
    for name in ("learner_device", "batcher_device", "evaluation_device"):
        check_device_exists(getattr(config, name), argument=name)
    if config.ray_actors and importlib.util.find_spec("ray") is None:
        raise MissingDependencyError(f"ray_actors={config.ray_actors} runs the training batcher on Ray, which is not "
                                     "installed here; pip install 'rlstruct[ray]', or drop --ray-actors")
    if config.ray_address is not None and not config.ray_actors:
        raise ConfigError(f"ray_address={config.ray_address!r} names a Ray cluster for the training batcher's actors, "
                          "got ray_actors=0; pass --ray-actors N too, or drop --ray-address")
    check_trackers(config.track)


def check_autocast(config: AutocastPart, title: str) -> None:
    """Checks ``config.autocast`` (a config with an :class:`AutocastPart`), for every algorithm that has it, on- or
    off-policy (:func:`~.session.validate` calls it before the family's checks).

    Raises:
        ValueError: it is not one of :data:`AUTOCAST_VALUES`.
        ConfigError: it is not ``none`` and ``check_devices`` is on.
    """
    if config.autocast not in AUTOCAST_VALUES:
        raise ValueError(
            f"autocast must be one of {list(AUTOCAST_VALUES)}, got {config.autocast!r}; pass --autocast bfloat16 for "
            "the update's and the training policy's forward in bfloat16, or leave the default (none: float32)"
        )
    if config.autocast != "none" and getattr(config, "check_devices", False):
        raise ConfigError(
            f"{title}: autocast={config.autocast!r} does not support check_devices=True (the checked replay runs step "
            "by step, in float32, for debugging); drop --autocast or --check-devices"
        )


def check_fast_path(config: RunConfig, title: str) -> None:
    """Checks the fast-path flags of ``config``'s parts (:class:`FastPathPart`, :class:`CapturedPart`), for every
    algorithm that has them, on- or off-policy.

    Raises:
        ConfigError: ``compile_update`` with ``check_devices``, or ``cuda_graph`` without a CUDA ``batcher_device``.
    """
    if isinstance(config, FastPathPart) and config.compile_update and config.check_devices:
        raise ConfigError(f"{title}: compile_update=True does not support check_devices=True (the checked replay runs "
                          "step by step for debugging); drop --compile-update or --check-devices")
    # Asked of the seam (rlstruct._accel), so that a test's recording fake on the CPU drives a captured run.
    if isinstance(config, CapturedPart) and config.cuda_graph and accelerator_for(config.batcher_device) is None:
        raise ConfigError(
            f"{title}: cuda_graph=True needs a CUDA batcher_device, got batcher_device={config.batcher_device!r}; "
            "pass --batcher-device cuda or drop --cuda-graph"
        )


def check_on_policy(config: OnPolicyConfig, title: str) -> None:
    """Checks the on-policy family's settings: the fast path (:func:`check_fast_path`), the step budget of
    ``anneal_lr``, then those of the parts ``config`` is made of (its collection, its policy).

    Raises:
        ConfigError: ``anneal_lr`` without a step budget; fast-path flags that cannot work together
            (:func:`check_fast_path`'s; ``compile_update`` or ``compile_policy`` with ``recurrent``); ``autocast`` is
            :func:`check_autocast`'s.
        ValueError: a setting is out of range.
    """
    check_fast_path(config, title)
    if isinstance(config, RecurrentPart):
        pairs = [("compile_policy", "recurrent", "it compiles the feed-forward policy's step"),
                 ("compile_update", "recurrent", "a window is replayed step by step through the LSTM, with per-row "
                                                 "resets")]
        for flag, other, why in pairs:
            if getattr(config, flag) and getattr(config, other):
                raise ConfigError(f"{title}: {flag}=True does not support {other}=True ({why}); drop "
                                  f"--{flag.replace('_', '-')} or --{other.replace('_', '-')}")
    if isinstance(config, MinibatchPart):
        batch = config.n_envs * config.n_steps
        if config.n_minibatches > batch:
            raise ValueError(f"n_minibatches must be <= the steps per collection (n_envs * n_steps = {batch}), got "
                             f"{config.n_minibatches}; lower n_minibatches or collect more steps")
    if config.anneal_lr and config.max_env_steps is None:
        raise ConfigError(
            "anneal_lr decays the learning rate over the step budget max_env_steps, got max_env_steps=None; pass "
            "--max-env-steps N (e.g. 500000), or --no-anneal-lr for a constant learning rate"
        )


def check_off_policy(config: OffPolicyConfig, title: str) -> None:
    """Checks the off-policy family's settings, the fast path's of an algorithm that has it
    (:func:`check_fast_path`) first.

    Raises:
        ConfigError: :func:`check_fast_path`'s.
        ValueError: a setting is out of range.
    """
    check_fast_path(config, title)
    if config.priority_alpha < 0 or not 0 <= config.priority_beta0 <= 1:
        raise ValueError(f"priority_alpha must be >= 0 and priority_beta0 in [0, 1], got "
                         f"priority_alpha={config.priority_alpha!r}, priority_beta0={config.priority_beta0!r}")


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
