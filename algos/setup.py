"""What every algorithm is to the loops and the command line (:class:`Algorithm`), and the one check of a run's
settings before anything is built (:func:`prepare`, which gives a :class:`Setup`).

A run is checked once, at the public boundary: the shared settings, the algorithm's own, the env (described once,
by building one CPU env) and, with ``resume``, the checkpoint (read once). The :class:`Setup` carries what that
found (the env's :class:`~rlstruct.algos.env_spec.EnvSpec`, the checkpoint's content, the resolved learner device)
down to the loop, which trusts it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from rlstruct.algos.checkpoints import Resume, load_resume
from rlstruct.algos.config import RunConfig, validate_run_config
from rlstruct.algos.distributed import World, rank_device, world_from_environment
from rlstruct.algos.env_spec import EnvSpec, describe_env, evaluation_env_kwargs
from rlstruct.algos.presets import apply_preset
from rlstruct.algos.record import check_logdir, run_logdir
from rlstruct.algos.recording import check_videos
from rlstruct.devices import as_device
from rlstruct.errors import ConfigError

__all__ = ["Algorithm", "Setup", "prepare", "warn_stalling_evaluations"]

log = logging.getLogger(__name__)


def _no_check(*args: Any) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """An algorithm as the loops and the command line see it: its name, its config, and its checks.

    Attributes:
        name: the command's name (``rlstruct train a2c``), also the log folder's and the checkpoint's.
        title: the name in the learning curve's title, e.g. ``"A2C"``.
        config_cls: its config dataclass (a :class:`~rlstruct.algos.config.RunConfig`), with ``RESUME_FIELDS``: the
            settings a resumed run must share with its checkpoint besides the shared ones.
        description: one line for ``--help``.
        check_config: raises on the algorithm's own settings (after the shared ones are checked, before the env is
            built): ``(config) -> None``.
        check_env: raises when the algorithm cannot run on the env: ``(config, spec) -> None``.
    """

    name: str
    title: str
    config_cls: type
    description: str
    check_config: Callable[[Any], None] = _no_check
    check_env: Callable[[Any, EnvSpec], None] = _no_check


@dataclasses.dataclass(frozen=True)
class Setup:
    """A run's checked settings and what checking them found, handed to the loop.

    Attributes:
        algorithm: the algorithm.
        config: its checked config, with its preset applied (every setting resolved, ``preset`` naming the one used).
        spec: the env's description (from one CPU env).
        resume: the checkpoint the run continues, read and checked (``None``: a fresh run).
        learner_device: ``config.learner_device``, resolved.
        start: ``time.perf_counter()`` when the run was launched (the checks, and for ``rlstruct train`` the imports,
            count in its wall time).
        world: this process's rank in a data-parallel run (``torchrun``), or a world of one.
    """

    algorithm: Algorithm
    config: RunConfig
    spec: EnvSpec
    resume: Resume | None
    learner_device: torch.device
    start: float
    world: World = World()


def check_evaluation_envs(config: RunConfig, spec: EnvSpec) -> None:
    """Builds one evaluation env of a run whose ``evaluation_env_kwargs`` are given: its constructor must take them,
    and the policy trained on the training envs' spaces (``spec``) must fit its spaces.

    Raises:
        ValueError: the constructor refuses an argument of ``evaluation_env_kwargs``.
        ConfigError: the evaluation env's observations or actions differ from the training envs'.
    """
    kwargs = evaluation_env_kwargs(config.env, config.backend, config.env_kwargs, config.evaluation_env_kwargs)
    evaluated = describe_env(config.env, config.backend, config.max_episode_steps, kwargs,
                             argument="evaluation_env_kwargs")
    # The time limit and the solved return may differ: the evaluation runs to the training envs' limit.
    same = dataclasses.replace(evaluated, max_episode_steps=spec.max_episode_steps,
                               reward_threshold=spec.reward_threshold)
    if same != spec:
        raise ConfigError(f"evaluation_env_kwargs must leave the env's spaces as training has them, got "
                          f"{config.evaluation_env_kwargs!r}, which gives {evaluated} against {spec}; drop the "
                          "arguments that change the observations or the actions")


def warn_stalling_evaluations(config: RunConfig, spec: EnvSpec) -> None:
    """Warns when a run evaluates the greedy policy on whole Atari games: a greedy policy that never presses FIRE
    after a lost life (an untrained one, in Breakout) plays until ALE's cap, and each evaluation then takes minutes
    (500 s on 2 CPUs, blocking training). The Atari presets (``ppo-atari``, ``dqn-atari``) sample the policy instead."""
    if config.env.startswith("ALE/") and config.evaluation_policy == "greedy" and config.evaluation_max_steps is None:
        log.warning("%s: the evaluations play the greedy policy for up to %d steps a game, and one that never presses "
                    "FIRE plays until that cap (minutes per evaluation); pass --evaluation-policy sample (Atari's "
                    "protocol) or --evaluation-max-steps N", config.env, spec.max_episode_steps)


def prepare(algorithm: Algorithm, config: RunConfig, *, checkpoint: dict[str, Any] | None = None,
            start: float | None = None) -> Setup:
    """Applies the preset of ``config`` (:func:`~rlstruct.algos.presets.apply_preset`: its settings fill the fields
    not given) and checks the result for ``algorithm`` before anything is built: the shared settings, the
    algorithm's own, the env's spaces, and the checkpoint of ``config.resume``.

    Args:
        algorithm: the algorithm.
        config: its config.
        checkpoint: the content of ``config.resume`` when the caller has read it already (the command line reads
            it for the flags' defaults), so that it is read once.
        start: ``time.perf_counter()`` at the run's launch (default: now); ``rlstruct train`` passes its process's
            start (:func:`~rlstruct.algos.command.launched_at`), so that the wall time counts the imports.

    Raises:
        DeviceUnavailableError: a device of the config does not exist here.
        SpaceError: the algorithm cannot run on the env's spaces.
        ValueError: a setting is out of range, or ``resume`` is not an rlstruct checkpoint.
        FileNotFoundError: ``resume`` does not exist.
        ConfigError: an unknown ``preset`` or one of another algorithm or env, settings that cannot work together, a
            ``resume`` trained by another number of data-parallel ranks, a
            ``resume`` this config cannot continue (see
            :func:`~rlstruct.algos.checkpoints.load_resume`), or a log folder that cannot be created or written.
    """
    start = time.perf_counter() if start is None else start
    config, _ = apply_preset(algorithm.name, config)
    validate_run_config(config)
    check_videos(config)
    algorithm.check_config(config)
    spec = describe_env(config.env, config.backend, config.max_episode_steps, config.env_kwargs)
    algorithm.check_env(config, spec)
    warn_stalling_evaluations(config, spec)
    if config.evaluation_env_kwargs is not None:
        check_evaluation_envs(config, spec)
    resume = load_resume(algorithm.name, config, algorithm.config_cls.RESUME_FIELDS, checkpoint=checkpoint)
    world = world_from_environment()
    if world.distributed:  # "cuda" is this rank's GPU (cuda:LOCAL_RANK); counting GPUs initialises no CUDA context
        n_gpus = torch.cuda.device_count()
        devices = {name: rank_device(getattr(config, name), world, n_gpus)
                   for name in ("learner_device", "batcher_device", "evaluation_device")}
        config = dataclasses.replace(config, **devices)
    if resume is not None and resume.world_size != world.size:
        raise ConfigError(f"resume={config.resume!r} was trained by {resume.world_size} data-parallel rank(s), got "
                          f"{world.size} (WORLD_SIZE); resume it with torchrun --nproc-per-node {resume.world_size} "
                          "(over all nodes), or start a new run without --resume")
    check_logdir(run_logdir(algorithm.name, config, resume))  # last: a run that fails a check creates no folder
    return Setup(algorithm, config, spec, resume, as_device(config.learner_device), start, world)
