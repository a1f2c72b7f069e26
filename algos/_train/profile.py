"""Where the time of a training loop goes, and how many envs and processes to run.

:func:`profile_training` runs a few iterations of an algorithm's training loop (its family's, whichever it is) with a
:class:`~rlstruct.batchers.profile.LoopTimer` and returns a :class:`~rlstruct.batchers.profile.ProfileReport`:
seconds and shares of wall-clock time for env step, agent forward, buffer writes, host–device copies, waiting on
workers, normalisation, the replay buffer's push, the algorithm's learn step, weight updates and the iteration's
record. The collection phases come from :meth:`RL_Batcher.timings`, the learner's from the timer.

:func:`batcher_measure` is the measurement ``rlstruct autotune`` hands to
:func:`rlstruct.batchers.autotune.autotune`: the steps/s and memory of an :class:`RL_Batcher` of the same
policy agent on a :func:`~rlstruct.envs.make_env` env.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rlstruct.algos._env_spec import create_env, describe_env
from rlstruct.algos._train.loops import run
from rlstruct.algos._train.presets import apply_preset
from rlstruct.algos._train.registry import ALGORITHMS, algorithm
from rlstruct.algos._train.session import seeded_model, validate
from rlstruct.algos.networks import build_actor_critic
from rlstruct.algos.policies import create_policy_agent
from rlstruct.batchers import RL_Batcher
from rlstruct.batchers.autotune import AutotuneResult, Measurement, autotune, available_gpu_bytes, host_rss
from rlstruct.batchers.profile import LoopTimer, ProfileReport
from rlstruct.devices import DeviceLike, check_device_exists, cpu_state_dict

__all__ = ["profile_training", "profiled_algorithms", "batcher_measure", "autotune_batcher"]


def _agent_args(env: str, backend: str, hidden: int, device: torch.device) -> dict[str, Any]:
    spec = describe_env(env, backend, None)
    spec.require("batcher_measure", env, discrete=True, pixels=False,
                 fix="keep the default CartPole-v1 (rlstruct autotune runs a discrete-action MLP policy)")
    return {"spec": spec, "hidden_sizes": (hidden, hidden), "device": str(device)}


def profiled_algorithms() -> list[str]:
    """The built-in algorithms :func:`profile_training` runs: those that collect a fixed number of steps per
    iteration (auto-reset envs: a description with a ``steps_setting``), of every family.

    >>> profiled_algorithms()
    ['a2c', 'dqn', 'ppo', 'sac', 'pqn', 'td3', 'impala']
    """
    return [name for name in ALGORITHMS if algorithm(name).steps_setting is not None]


#: the settings of :func:`profile_training` that only some configs have, and their value when not asked for
_OPTIONAL_SETTINGS = {"overlap": False, "cuda_graph": False, "autocast": "none", "compile_policy": False}
#: the profile's own values of the settings its arguments do not give, where no preset applies (and 32 for the
#: steps setting)
_PROFILE_DEFAULTS = {"n_envs": 256, "n_processes": 0, "hidden_sizes": (64, 64)}
#: the config fields a profile run sets itself or takes as its own arguments, which ``settings`` may not (besides the
#: description's steps setting)
PROFILE_SETS = frozenset({"env", "backend", "n_envs", "n_processes", "batcher_device", "learner_device", "seed",
                          "physics_dtype", "preset", "time_limit", "n_evaluation_envs", "eval_every", "progress",
                          "logdir", "max_env_steps", "resume", "overlap", "cuda_graph", "autocast", "compile_policy",
                          "learning_starts"})


def profile_training(
    env: str = "CartPole-v1",
    *,
    algo: str = "a2c",
    preset: str = "none",
    n_envs: int | None = None,
    n_processes: int | None = None,
    n_timesteps: int | None = None,
    iterations: int = 10,
    device: DeviceLike = "cpu",
    learner_device: DeviceLike | None = None,
    backend: str = "torch",
    hidden: int | None = None,
    lr: float | None = None,
    gamma: float | None = None,
    seed: int = 0,
    sync: bool = True,
    cuda_graph: bool = False,
    overlap: bool = False,
    physics_dtype: str = "float64",
    autocast: str = "none",
    compile_policy: bool = False,
    settings: Mapping[str, Any] | None = None,
) -> ProfileReport:
    """Trains ``algo`` for ``iterations`` iterations of its training loop (``rlstruct train``'s, the one its
    description carries) and reports where the time goes.

    The run is the loop with a :class:`~rlstruct.batchers.profile.LoopTimer`: each iteration collects
    ``n_timesteps`` steps (the description's ``steps_setting``) of ``n_envs`` auto-reset envs on ``device`` over
    ``n_processes`` workers (``collect``, split into the batcher's phases), moves them to ``learner_device``
    (``to_learner``), then times the learner's phases of its family: the on-policy loop normalises them
    (``normalize``) and runs the algorithm's learn step (``learn``); the off-policy loop pushes them into its replay
    buffer (``push``) and takes its gradient steps (``learn``), from the first iteration on (``learning_starts``
    0); both send the weights to the batcher (``update_weights``) and record the iteration (``record``). The
    other settings are the algorithm's config defaults, or those of ``preset`` and ``settings``; the logs go to a
    temporary folder. One warm-up iteration runs first and is not counted (two with ``cuda_graph``: the first
    acquisition is eager, the second captures), nor are the run's first and final evaluations (one episode each);
    there is no other evaluation and no progress bar.

    Args:
        env: a gymnasium id the algorithm runs on (``CartPole-v1``, ``Acrobot-v1``, ``Pendulum-v1`` for SAC).
        algo: the algorithm: one of :func:`profiled_algorithms`, ``MODULE:ATTRIBUTE`` or an installed one's name,
            whose description has a ``steps_setting``.
        preset: a preset of ``algo`` (``rlstruct presets``): its run, as ``rlstruct train --preset`` makes it (the
            preset's settings, the config's defaults for the rest), with the settings given here; ``"auto"`` the
            env's own, ``"none"`` (default) none.
        n_envs: envs in all, split over the workers as ``rlstruct train --n-envs`` (None: the preset's run's, else
            256).
        n_processes: batcher worker processes (0: this process; None: the preset's run's, else 0).
        n_timesteps: steps per acquisition (the description's ``steps_setting``; None: the preset's run's, else
            32).
        iterations: profiled iterations.
        device: the batcher's device (envs, agent, output).
        learner_device: where the learn step runs (default ``device``).
        backend: env backend for :func:`~rlstruct.envs.make_env`.
        hidden: width of the two hidden layers of the networks (None: the preset's run's, else 64).
        lr: Adam learning rate (``None``: the algorithm's default).
        gamma: discount (``None``: the algorithm's default).
        seed: seeds the envs, the network and the sampling.
        sync: synchronize a GPU at phase boundaries (the batcher's ``sync_timings`` and the timer's), so that the
            split is exact; off, GPU phases show up where the work is waited for.
        cuda_graph: the config's ``cuda_graph`` (a GPU ``device``): the batcher's steps show as ``graph_replay``.
        overlap: the config's ``overlap`` (on-policy): collect the next batch while learning on this one (in
            process, the batcher's ``zero_copy`` double buffer).
        physics_dtype: ``"float64"`` or ``"float32"``: the torch simulators' physics precision.
        autocast: ``"none"`` or ``"bfloat16"``: the learn step's forward and the batcher's policy under
            ``torch.autocast`` (``rlstruct train --autocast``).
        compile_policy: compile the batcher's policy step (``rlstruct train --compile-policy``); the warm-up
            iteration compiles it.
        settings: more fields of the algorithm's config, by name (IMPALA's ``{"max_lag": 2}``, ``hidden_sizes``,
            ``lr``); they win over the preset's, and the arguments above, where given, over them. Not those the
            profile sets itself or takes as an argument of its own (:data:`PROFILE_SETS`, the steps setting).

    Returns:
        A :class:`~rlstruct.batchers.profile.ProfileReport`.

    Raises:
        ValueError: ``algo`` collects whole episodes (no ``steps_setting``), ``iterations`` below 1, a setting its
            config does not have (``overlap``, ``autocast``, ``cuda_graph``, ``compile_policy``, a name in
            ``settings``) asked for, one the profile sets itself in ``settings``, or one that the algorithm's config
            refuses (``n_envs``, ``n_timesteps``, ``n_processes``, ``physics_dtype``, ``autocast``, ``cuda_graph``
            off CUDA, an env the algorithm cannot run on).
        ConfigError: an unknown ``preset``, or one of another algorithm or env.
        DeviceUnavailableError: a device this machine does not have.

    >>> report = profile_training("CartPole-v1", n_envs=8, n_timesteps=4, iterations=2)
    >>> list(report.seconds)[-7:], report.env_steps
    (['to_learner', 'normalize', 'push', 'learn', 'update_weights', 'record', 'other'], 64)
    """
    description = algorithm(algo)  # a built-in's name, MODULE:ATTRIBUTE, or an installed one's
    steps = description.steps_setting
    if steps is None:
        raise ValueError(f"algo must collect a fixed number of steps per iteration (one of {profiled_algorithms()}, "
                         f"or a description with a steps_setting), got {algo!r}, which collects whole episodes; "
                         "profile one of them")
    if not isinstance(iterations, int) or iterations < 1:
        raise ValueError(f"iterations must be an int >= 1, got {iterations!r}")
    fields = {f.name for f in dataclasses.fields(description.config_cls)}
    extra = dict(settings or {})
    unknown, owned = sorted(set(extra) - fields), sorted(set(extra) & (PROFILE_SETS | {steps}))
    if unknown:
        raise ValueError(f"settings must name fields of {description.config_cls.__name__}, got {unknown}; "
                         f"the settings page lists {description.title}'s")
    if owned:
        raise ValueError(f"settings must not set {owned}, which the profile sets itself; give them as its own "
                         "arguments (n_timesteps, --n-timesteps, for the steps per acquisition), or leave them to it")
    dev = check_device_exists(device)
    ldev = dev if learner_device is None else check_device_exists(learner_device)
    warmup = 2 if cuda_graph else 1  # allocator, lazy initialisations, compilation (and the graph's capture)
    chosen: dict[str, Any] = {
        "env": env, "backend": backend, "batcher_device": str(dev), "learner_device": str(ldev), "seed": seed,
        "physics_dtype": physics_dtype, "preset": preset, "time_limit": 1e9, "n_evaluation_envs": 1,
        "eval_every": 2**31 - 1, "progress": False, **extra,
    }
    asked = {"overlap": overlap, "cuda_graph": cuda_graph, "autocast": autocast, "compile_policy": compile_policy,
             "lr": lr, "gamma": gamma, "learning_starts": 0, "n_envs": n_envs, "n_processes": n_processes,
             steps: n_timesteps, "hidden_sizes": None if hidden is None else (hidden, hidden)}
    for name, value in asked.items():
        if name in fields and value is not None:
            chosen[name] = value
        elif name in _OPTIONAL_SETTINGS and value != _OPTIONAL_SETTINGS[name]:
            raise ValueError(f"{name} is not a setting of {description.title}, got {name}={value!r}; profile "
                             f"{description.title} without it")
    with tempfile.TemporaryDirectory(prefix="rlstruct-profile-") as logdir:
        # a preset fills what was not chosen, as for `rlstruct train --preset` (the config's defaults the rest);
        # without one, the profile's own defaults do
        config, applied = apply_preset(description.name, description.config_cls(**chosen, logdir=logdir),
                                       frozenset(chosen))
        if applied is None:
            defaults = {name: value for name, value in {**_PROFILE_DEFAULTS, steps: 32}.items()
                        if name in fields and name not in chosen}
            config = dataclasses.replace(config, **defaults)
        n_workers = max(config.n_processes, 1) if isinstance(config.n_processes, int) else 1
        counts = all(isinstance(v, int) and v >= 1 for v in (config.n_envs, getattr(config, steps)))
        per_iteration = config.n_envs * getattr(config, steps) if counts else 1  # else the config's check names it
        config = dataclasses.replace(config, max_env_steps=(warmup + iterations) * per_iteration)
        timer = LoopTimer(ldev, sync=sync, warmup=warmup)
        run(validate(description, config, given=frozenset(fields)), timer=timer)
    report_config = {"algo": algo, "env": env, "preset": config.preset, "n_envs": config.n_envs,
                     "n_processes": config.n_processes, "n_timesteps": getattr(config, steps),
                     "iterations": iterations, "device": str(dev), "learner_device": str(ldev), "backend": backend,
                     "hidden": list(config.hidden_sizes) if hasattr(config, "hidden_sizes") else None, "sync": sync,
                     "cuda_graph": cuda_graph, "overlap": overlap, "physics_dtype": physics_dtype,
                     "autocast": autocast, "compile_policy": compile_policy, "settings": extra}
    return timer.report(n_workers, report_config)


def batcher_measure(
    env: str = "CartPole-v1",
    *,
    n_timesteps: int = 32,
    iters: int = 3,
    device: DeviceLike = "cpu",
    backend: str = "torch",
    hidden: int = 64,
    seed: int = 0,
) -> Callable[[int, int], Measurement]:
    """A ``measure(n_processes, n_envs)`` for :func:`~rlstruct.batchers.autotune.autotune`.

    Each call builds an :class:`RL_Batcher` of the algorithms' policy agent (``n_processes`` workers of
    ``n_envs`` auto-reset envs on ``device``), runs one warm-up acquisition, then times ``iters``
    acquisitions of ``n_timesteps`` steps. Memory is taken while the batcher is alive: host RSS of this
    process and its children (less this process's RSS before), and on a GPU the peak allocated by this
    process (``n_processes=0``) or the device memory in use that appeared since the start (worker
    processes, measured with ``torch.cuda.mem_get_info``).

    Args:
        env: a gymnasium id with discrete actions and a flat observation.
        n_timesteps: steps per acquisition.
        iters: timed acquisitions.
        device: the batcher's device.
        backend: env backend.
        hidden: width of the hidden layers of the policy.
        seed: env and policy seed.

    Raises:
        ValueError: ``env`` does not have discrete actions and a flat observation.
        DeviceUnavailableError: a device this machine does not have.

    >>> m = batcher_measure("CartPole-v1", n_timesteps=2, iters=1)(0, 4)
    >>> m.steps_per_s > 0, m.gpu_bytes
    (True, None)
    """
    dev = check_device_exists(device)
    agent_args = _agent_args(env, backend, hidden, dev)
    weights = cpu_state_dict(seeded_model(seed, build_actor_critic, agent_args["spec"], agent_args["hidden_sizes"]))

    def measure(n_processes: int, n_envs: int) -> Measurement:
        n_workers = max(n_processes, 1)
        base_rss = host_rss()
        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            base_free = available_gpu_bytes(dev)
        env_args = {"name": env, "n_envs": n_envs, "device": str(dev), "autoreset": True, "backend": backend}
        with RL_Batcher(n_timesteps, create_policy_agent, agent_args, create_env, env_args, n_processes,
                        [seed + k for k in range(n_workers)], device=dev) as b:
            b.update(weights)
            b.reset()
            b.execute()
            b.get()
            b.reset_timings()
            t0 = time.perf_counter()
            for _ in range(iters):
                b.execute()
                b.get()
            if cuda:
                torch.cuda.synchronize(dev)
            elapsed = time.perf_counter() - t0
            steps = b.timings()["env_steps"]
            host = max(host_rss() - base_rss, 0)
            gpu = None
            if cuda:
                own = torch.cuda.max_memory_allocated(dev)
                gpu = own if n_processes == 0 else max(base_free - available_gpu_bytes(dev), own)
        return Measurement(steps / elapsed, int(host), None if gpu is None else int(gpu))

    return measure


def autotune_batcher(
    env: str = "CartPole-v1",
    *,
    process_counts: Sequence[int] = (1, 2),
    min_envs: int = 128,
    max_envs: int = 2**14,
    n_timesteps: int = 32,
    iters: int = 3,
    device: DeviceLike = "cpu",
    backend: str = "torch",
    **kwargs: Any,
) -> AutotuneResult:
    """:func:`~rlstruct.batchers.autotune.autotune` with :func:`batcher_measure` on ``env`` (``rlstruct autotune``).

    Extra keyword arguments go to :func:`~rlstruct.batchers.autotune.autotune`.
    """
    measure = batcher_measure(env, n_timesteps=n_timesteps, iters=iters, device=device, backend=backend)
    config = {"env": env, "n_timesteps": n_timesteps, "iters": iters, "device": str(device), "backend": backend}
    return autotune(measure, process_counts=process_counts, min_envs=min_envs, max_envs=max_envs, device=device,
                    config=config, **kwargs)
