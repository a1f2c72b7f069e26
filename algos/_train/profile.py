"""Where the time of a training loop goes, and how many envs and processes to run: measured with A2C's learner.

:func:`profile_training` runs a short collect → learn loop (the :class:`~rlstruct.algos.networks.ActorCritic`
of the algorithms, trained by :func:`~rlstruct.algos.a2c.a2c_loss` on GAE advantages) and returns a
:class:`~rlstruct.batchers.profile.ProfileReport`: seconds and shares of wall-clock time for env step, agent
forward, buffer writes, host–device copies, waiting on workers, loss, backward, optimizer and weight
updates. The collection phases come from :meth:`RL_Batcher.timings`; the learner phases from
:class:`~rlstruct.batchers.profile.PhaseTimer`.

:func:`batcher_measure` is the measurement ``rlstruct autotune`` hands to
:func:`rlstruct.batchers.autotune.autotune`: the steps/s and memory of an :class:`RL_Batcher` of the same
policy agent on a :func:`~rlstruct.envs.make_env` env.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlstruct.agents import replay_agent_stateless
from rlstruct.algos._train.config import check_physics_dtype
from rlstruct.algos._train.env_spec import create_env, describe_env
from rlstruct.algos._train.seeds import AGENT_SEEDS, ENV_SEEDS, worker_seeds
from rlstruct.algos._train.session import seeded_model
from rlstruct.algos._train.update import check_autocast
from rlstruct.algos.a2c import A2CConfig, a2c_loss
from rlstruct.algos.networks import (
    PolicyAgent,
    autocast_context,
    build_actor_critic,
    create_policy_agent,
    make_adam,
)
from rlstruct.algos.returns import gae_advantages
from rlstruct.batchers import RL_Batcher
from rlstruct.batchers.autotune import AutotuneResult, Measurement, autotune, available_gpu_bytes, host_rss
from rlstruct.batchers.profile import LEARNER_PHASES, PhaseTimer, ProfileReport, split_collection
from rlstruct.devices import DeviceLike, check_device_exists, cpu_state_dict

__all__ = ["profile_training", "batcher_measure", "autotune_batcher"]


def _agent_args(env: str, backend: str, hidden: int, device: torch.device) -> dict[str, Any]:
    spec = describe_env(env, backend, None)
    spec.require("profile_training", env, discrete=True, pixels=False,
                 fix="keep the default CartPole-v1 (rlstruct profile runs a discrete-action MLP policy)")
    return {"spec": spec, "hidden_sizes": (hidden, hidden), "device": str(device)}


def profile_training(
    env: str = "CartPole-v1",
    *,
    n_envs: int = 256,
    n_processes: int = 0,
    n_timesteps: int = 32,
    iterations: int = 10,
    device: DeviceLike = "cpu",
    learner_device: DeviceLike | None = None,
    backend: str = "torch",
    hidden: int = 64,
    lr: float = 1e-3,
    gamma: float = 0.99,
    seed: int = 0,
    sync: bool = True,
    cuda_graph: bool = False,
    zero_copy: bool = False,
    physics_dtype: str = "float64",
    autocast: str = "none",
    compile_policy: bool = False,
) -> ProfileReport:
    """Runs ``iterations`` of collect → learn and reports where the time goes.

    Each iteration: ``execute`` + ``get`` on an :class:`RL_Batcher` (``n_processes`` workers of ``n_envs``
    auto-reset envs each on ``device``), the trajectories to ``learner_device`` (``to_learner``), A2C's loss
    (the replay of the actor-critic over the batch, GAE advantages and :func:`~rlstruct.algos.a2c.a2c_loss`,
    the other settings at :class:`~rlstruct.algos.a2c.A2CConfig`'s defaults: ``loss``), ``backward``, an Adam
    step (``optimizer``), and ``update`` of the workers' weights (``update_weights``). One warm-up iteration
    runs first and is not counted.

    Args:
        env: a gymnasium id with discrete actions and a flat observation (``CartPole-v1``, ``Acrobot-v1``).
        n_envs: envs per worker.
        n_processes: batcher worker processes (0: this process).
        n_timesteps: steps per acquisition.
        iterations: profiled iterations.
        device: the batcher's device (envs, agent, output).
        learner_device: where the loss runs (default ``device``).
        backend: env backend for :func:`~rlstruct.envs.make_env`.
        hidden: width of the two hidden layers of the actor and of the critic.
        lr: Adam learning rate.
        gamma: discount.
        seed: seeds the envs, the network and the sampling.
        sync: synchronize a GPU at phase boundaries (the batcher's ``sync_timings`` and the
            :class:`PhaseTimer`), so that the split is exact; off, GPU phases show up where the work is
            waited for.
        cuda_graph: the batcher's ``cuda_graph`` (a GPU ``device``): its steps then show as ``graph_replay``.
            Two warm-up iterations run instead of one (the first acquisition is eager, the second captures).
        zero_copy: the batcher's ``zero_copy``: ``get`` returns views of its buffer, and ``gather`` shrinks to
            wrapping them (each iteration uses its trajectories before the next ``execute``).
        physics_dtype: ``"float64"`` or ``"float32"``: the torch simulators' physics precision.
        autocast: ``"none"`` or ``"bfloat16"``: the loss's forward and the batcher's policy under
            ``torch.autocast`` (``rlstruct train --autocast``).
        compile_policy: compile the batcher's policy step (``rlstruct train --compile-policy``); the warm-up
            iteration compiles it.

    Returns:
        A :class:`~rlstruct.batchers.profile.ProfileReport`.

    Raises:
        ValueError: ``iterations``, ``n_envs`` or ``n_timesteps`` below 1, ``env`` without discrete actions
            or a flat observation, ``cuda_graph`` with a ``device`` other than CUDA, a ``physics_dtype`` that
            :func:`~rlstruct.algos._train.config.check_physics_dtype` refuses, or an ``autocast`` not in
            :data:`~rlstruct.algos._train.update.AUTOCAST_DTYPES`.
        DeviceUnavailableError: a device this machine does not have.

    >>> report = profile_training("CartPole-v1", n_envs=8, n_timesteps=4, iterations=2)
    >>> list(report.seconds)[:5], report.env_steps
    (['env_step', 'agent_forward', 'buffer_write', 'copy', 'graph_replay'], 64)
    """
    for name, value in (("iterations", iterations), ("n_envs", n_envs), ("n_timesteps", n_timesteps)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not isinstance(n_processes, int) or n_processes < 0:
        raise ValueError(f"n_processes must be an int >= 0 (0 runs in this process), got {n_processes!r}")
    check_physics_dtype(physics_dtype, env, backend)
    dtype = check_autocast(autocast)
    dev = check_device_exists(device)
    ldev = dev if learner_device is None else check_device_exists(learner_device)
    agent_args = {**_agent_args(env, backend, hidden, dev), "autocast": dtype, "compile": compile_policy}
    a2c = A2CConfig(gamma=gamma)
    n_workers = max(n_processes, 1)
    env_args = {"name": env, "n_envs": n_envs, "device": str(dev), "autoreset": True, "backend": backend,
                "physics_dtype": physics_dtype}
    model = seeded_model(seed, build_actor_critic, agent_args["spec"], agent_args["hidden_sizes"])
    model.to(ldev)
    learner = PolicyAgent(model, ldev)
    optimizer = make_adam(model, lr, ldev)
    timer = PhaseTimer(ldev, sync=sync)
    with RL_Batcher(n_timesteps, create_policy_agent, agent_args, create_env, env_args, n_processes,
                    worker_seeds(seed, n_workers, ENV_SEEDS), agent_seeds=worker_seeds(seed, n_workers, AGENT_SEEDS),
                    device=dev, sync_timings=sync, cuda_graph=cuda_graph, zero_copy=zero_copy) as batcher:
        batcher.update(cpu_state_dict(model))
        batcher.reset()

        def iteration() -> None:
            t0 = time.perf_counter()
            batcher.execute()  # in-process (n_processes=0), the whole acquisition runs here
            timer.seconds["_execute"] = timer.seconds.get("_execute", 0.0) + time.perf_counter() - t0
            traj, _ = batcher.get()
            with timer("to_learner"):
                traj = traj.to(ldev)
            with timer("loss"), autocast_context(ldev, dtype):
                out = replay_agent_stateless(learner, traj, "replay_batch")
                tt = traj.trajectories
                with torch.no_grad():
                    advantages = gae_advantages(tt["_observation/reward"] * a2c.reward_scale, out["value"],
                                                out["next_value"], tt["_observation/terminated"],
                                                tt["_observation/done"], a2c.gamma, a2c.gae_lambda)
                loss, _ = a2c_loss(out["log_prob"], out["entropy"], out["value"], advantages, tt.mask(),
                                   value_coef=a2c.value_coef, entropy_coef=a2c.entropy_coef,
                                   normalize_advantages=a2c.normalize_advantages)
            with timer("backward"):
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            with timer("optimizer"):
                optimizer.step()
            with timer("update_weights"):
                batcher.update(cpu_state_dict(model))

        for _ in range(2 if cuda_graph else 1):  # warm-up: allocator, lazy inits (and the graph's capture)
            iteration()
        batcher.reset_timings()
        timer.reset()
        if sync and dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(iterations):
            iteration()
        wall = time.perf_counter() - t0
        bt = batcher.timings()
    seconds = split_collection(bt, timer.seconds.pop("_execute", 0.0) + bt["wait"], n_workers)
    seconds["gather"] = bt["gather"]
    for k in LEARNER_PHASES:
        seconds[k] = timer.seconds.get(k, 0.0)
    seconds["other"] = max(wall - sum(seconds.values()), 0.0)
    config = {"env": env, "n_envs": n_envs, "n_processes": n_processes, "n_timesteps": n_timesteps,
              "iterations": iterations, "device": str(dev), "learner_device": str(ldev), "backend": backend,
              "hidden": hidden, "sync": sync, "cuda_graph": cuda_graph, "zero_copy": zero_copy,
              "physics_dtype": physics_dtype, "autocast": autocast, "compile_policy": compile_policy}
    return ProfileReport(seconds, wall, int(bt["env_steps"]), iterations, bt, config)


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
