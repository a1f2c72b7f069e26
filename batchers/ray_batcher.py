"""RayBatcher: RL_Batcher's API over Ray actors, one per node or per GPU (extra ``rlstruct[ray]``).

Each actor hosts an ordinary local :class:`~rlstruct.batchers.RL_Batcher` (shared-memory CPU workers,
one GPU worker, or the actor's own process), so Ray carries one request per actor per collection, never
one per env step. The driver keeps the same state machine as RL_Batcher and rebuilds the Trajectories.

Three mechanisms make it safe and cheap:

* **Versioned weights.** ``update`` puts the weights in the object store once (``ray.put``) and numbers
  them; the reference rides on each actor's next acquisition (or reset), which applies it first. Every
  acquisition carries the weights version and the reset epoch it expects, and an actor holding anything
  else (Ray restarted it since) refuses to collect instead of acting on stale weights or a lost env state.
* **Transfers without serialisation copies.** Tensors travel as numpy arrays (pickle protocol 5 out of
  band), which Ray reads straight from the object store; the driver copies each result once, into the
  output tensors, exactly as RL_Batcher copies once out of its buffer.
* **No hangs.** Every wait on Ray has a timeout, a dead actor is reported as
  :class:`~rlstruct.errors.BatcherWorkerError` (or restarted and restored when ``max_restarts`` allows),
  and ``close()`` kills every actor and removes the placement group.

This module imports without Ray; Ray is imported when a RayBatcher is built.
"""

from __future__ import annotations

import logging
import os
import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlstruct.batchers._acquire import PHASES
from rlstruct.batchers._buffer import TEMPORAL_PREFIXES, trajectories_from
from rlstruct.batchers._common import (
    BatcherBase,
    Phase,
    check_cpu,
    check_cpu_state_dict,
    check_graph_placements,
    check_restart_workers,
)
from rlstruct.batchers._lifecycle import track, untrack
from rlstruct.batchers._placement import WorkerPlacement
from rlstruct.batchers._restart import RestartPolicy, WorkerRestart, restart_seeds
from rlstruct.batchers.batcher import RL_Batcher
from rlstruct.devices import DeviceLike, check_device_exists
from rlstruct.errors import BatcherStateError, BatcherWorkerError, MissingDependencyError
from rlstruct.structures import DictTensor, Trajectories

__all__ = ["RayBatcher", "PLACEMENT_STRATEGIES"]

log = logging.getLogger(__name__)

#: Ray placement-group strategies accepted by ``placement_strategy`` (``None``: no placement group).
PLACEMENT_STRATEGIES = ("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the tracebacks it formats
_CUDA_KEYS = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")


# --------------------------------------------------------------------------- wire format
# numpy has no bfloat16 / float8 / complex32: those travel as a same-width integer view.
_NUMPY_DTYPES = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
}
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor_to_numpy(t: torch.Tensor) -> tuple[np.ndarray, str | None]:
    """A numpy view of a CPU copy of ``t`` and, when numpy lacks its dtype, the torch dtype's name."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype in _NUMPY_DTYPES:
        return t.numpy(), None
    return t.view(_INT_OF_WIDTH[t.element_size()]).numpy(), _dtype_name(t.dtype)


def _numpy_to_tensor(a: np.ndarray, dtype_name: str | None) -> torch.Tensor:
    # The array may be a read-only view of the object store: torch warns, but nothing here writes to it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(a)
    return t if dtype_name is None else t.view(getattr(torch, dtype_name))


@dataclass
class _WireTensor:
    """A tensor inside a state dict on its way through the object store."""

    array: np.ndarray
    dtype: str | None


def _to_wire(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return _WireTensor(*_tensor_to_numpy(obj))
    if isinstance(obj, dict):
        return type(obj)((k, _to_wire(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_wire(v) for v in obj)
    return obj


def _from_wire(obj: Any) -> Any:
    if isinstance(obj, _WireTensor):
        return _numpy_to_tensor(obj.array, obj.dtype)
    if isinstance(obj, dict):
        return type(obj)((k, _from_wire(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_wire(v) for v in obj)
    return obj


def _trajectories_to_wire(traj: Trajectories) -> dict[str, Any]:
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for k, v in [*traj.info.items(), *traj.trajectories.items(), ("lengths", traj.trajectories.lengths)]:
        arrays[k], name = _tensor_to_numpy(v)
        if name is not None:
            dtypes[k] = name
    return {"arrays": arrays, "dtypes": dtypes}


class _StaleActorError(RuntimeError):
    """Raised in an actor asked to collect with weights or a reset it has not applied (it restarted since)."""


# --------------------------------------------------------------------------- the actor
class _BatcherActor:
    """The Ray actor: one local RL_Batcher, its weights version and its reset epoch."""

    def __init__(self, actor_id: int, environ: dict[str, str], num_threads: int | None, batcher_kwargs: dict):
        # Before anything touches CUDA: Ray may have set CUDA_VISIBLE_DEVICES for its own GPU choice, and an
        # explicit placement (a MIG slice, or none for a CPU actor) overrides it.
        os.environ.update(environ)
        self._environ_keys = (*_CUDA_KEYS, *(k for k in environ if k not in _CUDA_KEYS))
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        self.actor_id = actor_id
        self.version = 0
        self.epoch = 0
        self._kwargs = batcher_kwargs
        self.batcher = RL_Batcher(**batcher_kwargs)
        self.n_running = 0

    def info(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        report = {
            "actor_id": self.actor_id,
            "pid": os.getpid(),
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": ctx.get_node_id(),
            "accelerator_ids": ctx.get_accelerator_ids(),
            "environ": {k: os.environ.get(k) for k in self._environ_keys},
            "cuda_initialized": torch.cuda.is_initialized(),
            "workers": self.batcher.worker_reports(),
        }
        return {"n_envs": self.batcher.n_elems(), "specs": self.batcher._specs, "report": report}

    def _apply(self, version: int, weights: Any) -> None:
        if weights is not None:  # a new version rides on this call, as a reference resolved by Ray
            try:
                self.batcher.update(_from_wire(weights))
            except Exception as e:
                raise BatcherWorkerError(
                    f"applying the weights of update() (version {version}) failed: {e}", worker_id=self.actor_id
                ) from e
            self.version = version

    def reset(self, version: int, weights: Any, epoch: int, agent_info: DictTensor | None,
              env_info: DictTensor | None) -> None:
        self._apply(version, weights)
        self.batcher.reset(agent_info, env_info)
        self.epoch = epoch
        self.n_running = self.batcher.n_elems()

    def restore(self, restart: int, version: int, weights: Any, epoch: int, agent_info: DictTensor | None,
                env_info: DictTensor | None) -> None:
        """After Ray restarted this actor (its constructor ran again with its first seeds): rebuilds its
        RL_Batcher with the seeds of its ``restart``-th restart (:func:`~rlstruct.batchers.restart_seed`), then resets
        it."""
        kw = self._kwargs
        self.batcher.close()
        self.batcher = RL_Batcher(**{**kw, "seeds": restart_seeds(kw["seeds"], restart),
                                     "agent_seeds": restart_seeds(kw["agent_seeds"], restart)})
        self.reset(version, weights, epoch, agent_info, env_info)

    def acquire(self, version: int, weights: Any, epoch: int, agent_info: DictTensor | None) -> dict[str, Any] | None:
        self._apply(version, weights)
        if (self.version, self.epoch) != (version, epoch):
            raise _StaleActorError(
                f"actor {self.actor_id} holds weights version {self.version} and reset epoch {self.epoch}, the "
                f"acquisition expects version {version} and epoch {epoch} (the actor restarted since)"
            )
        if self.n_running == 0:  # every env of this actor finished: it yields no rows until the next reset
            return None
        self.batcher.execute(agent_info)
        traj, self.n_running = self.batcher.get()
        return {"wire": _trajectories_to_wire(traj), "n_running": self.n_running, "timings": self.batcher.timings()}

    def close(self) -> None:
        self.batcher.close()


# --------------------------------------------------------------------------- the driver
def _import_ray():
    try:
        import ray
    except ImportError as e:
        raise MissingDependencyError(
            "RayBatcher needs Ray, which is not installed; install it with `pip install 'rlstruct[ray]'` "
            "(or `pip install 'ray>=2.30'`), or use RL_Batcher"
        ) from e
    return ray


class _Failed:
    """An exception that one actor's call ended with, kept until the caller decides what it means."""

    def __init__(self, error: BaseException):
        self.error = error


class RayBatcher(BatcherBase):
    """RL_Batcher's API and output over Ray actors, each hosting a local RL_Batcher.

    A drop-in for RL_Batcher: built with exactly RL_Batcher's arguments it runs one actor hosting that
    RL_Batcher, so swapping the class name is the whole change; ``n_actors`` and the other keywords scale it
    out. The unit of work is an actor per node (or per GPU): it builds ``RL_Batcher(n_timesteps, create_agent,
    agent_args, create_env, env_args, n_processes, seeds_of_the_actor, ..., device=actor_device)``, so an
    acquisition costs Ray one call per actor. Rows are actor 0's envs (in its workers' order), then actor
    1's, and so on: ``RayBatcher(..., 0, [a, b], n_actors=2)`` returns the same trajectories as
    ``RL_Batcher(..., 2, [a, b])`` for the same agent seeds.

    Call ``ray.init()`` (a local cluster) or ``ray.init(address=...)`` (an existing one) first.
    Like RL_Batcher, it closes itself (with a ``ResourceWarning``) when garbage-collected or at interpreter exit
    while still open.

    The protocol and output are RL_Batcher's: ``reset`` → ``execute`` (returns at once) → ``get`` →
    ``(Trajectories, n_still_running)``, all on ``device``; ``update`` while nothing is pending. ``update``
    returns once the weights are in the object store: each actor applies them at the start of its next
    acquisition or reset, so an error in ``agent.update`` surfaces at the next ``get``/``reset``.

    Args:
        n_timesteps: steps per acquisition.
        create_agent: ``create_agent(**agent_args)`` (importable on every node).
        agent_args: keyword arguments of ``create_agent``.
        create_env: ``create_env(**env_args, seed=...)`` (importable on every node).
        env_args: keyword arguments of ``create_env``.
        n_processes: worker processes of each actor's RL_Batcher (0: the actor's own process).
        seeds: one env seed per worker of every actor, ``n_actors * max(n_processes, 1)`` of them, actor 0's
            first.
        agent_info: example ``agent_info`` (CPU), as for RL_Batcher.
        env_info: example ``env_info`` (CPU), as for RL_Batcher.
        agent_seeds: one agent seed per worker of every actor, or ``None``.
        device: where the driver returns the trajectories.
        n_actors: Ray actors (one per node or per GPU, typically).
        actor_device: the device of each actor's RL_Batcher, as the actor sees it (``"cuda:0"`` is the first
            GPU Ray assigned to it). Default: ``device``.
        worker_placements: passed to each actor's RL_Batcher (one per worker of an actor).
        actor_placements: one :class:`WorkerPlacement` per actor: its device (overrides ``actor_device``),
            ``visible_devices`` (a MIG slice), MPS settings and variables; they go into the actor's
            ``runtime_env`` ``env_vars`` and are applied again before CUDA starts, over Ray's own choice.
        num_cpus: Ray CPUs per actor (fractions allowed); default ``max(n_processes, 1)``.
        num_gpus: Ray GPUs per actor (fractions allowed, e.g. 0.5 to put two actors on a GPU); default 1 for an
            actor on a CUDA device (without ``visible_devices``), else 0.
        placement_strategy: ``"SPREAD"``, ``"PACK"``, ``"STRICT_SPREAD"``, ``"STRICT_PACK"`` to place the actors
            through a placement group of one bundle each, or ``None`` to let Ray choose.
        runtime_env: a Ray ``runtime_env`` for the actors (merged with the placements' variables).
        max_restarts: restarts Ray may make of a dead actor (-1: unlimited). With 0 a dead actor is a
            :class:`BatcherWorkerError`; otherwise ``get`` restores it (its RL_Batcher rebuilt with the seeds
            :func:`~rlstruct.batchers.restart_seed` draws from its first ones and its restart count, the latest
            weights, a reset with the last ``agent_info``/``env_info``) and collects its rows again, from fresh
            episodes; each restore is logged as a warning and recorded in :attr:`restarts`.
        restart_workers: passed to each actor's RL_Batcher: how many of its failed worker processes it may
            replace (see :class:`RL_Batcher`), within the actor, without Ray restarting the actor.
        timeout: seconds any wait on an actor may last (and on a worker of an actor's RL_Batcher).
        start_timeout: seconds to place and start the actors, or to restore a restarted one (default
            ``max(timeout, 120)``).
        sync_timings: passed to each actor's RL_Batcher.
        cuda_graph: passed to each actor's RL_Batcher (every actor, and every worker of it, on a GPU): each
            worker replays its acquisitions as one CUDA graph.
        zero_copy: passed to each actor's RL_Batcher (its result is copied into the object store anyway).

    Raises:
        MissingDependencyError: Ray is not installed.
        BatcherStateError: Ray is not initialised, or ``seeds``/``agent_seeds`` have the wrong length.
        SeedError: a seed of ``seeds`` or ``agent_seeds`` is not an int in ``[0, 2**31)``.
        BatcherWorkerError: an actor failed to start (or could not be placed within the timeout).
    """

    _name = "RayBatcher"
    _unit = "an actor"
    _rows = "the sum of every actor's envs"

    def __init__(
        self,
        n_timesteps: int,
        create_agent: Callable[..., Any],
        agent_args: dict,
        create_env: Callable[..., Any],
        env_args: dict,
        n_processes: int,
        seeds: Sequence[int],
        agent_info: DictTensor | None = None,
        env_info: DictTensor | None = None,
        agent_seeds: Sequence[int] | None = None,
        device: DeviceLike = "cpu",
        *,
        n_actors: int = 1,
        actor_device: DeviceLike | None = None,
        worker_placements: Sequence[WorkerPlacement] | None = None,
        actor_placements: Sequence[WorkerPlacement] | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        placement_strategy: str | None = None,
        runtime_env: dict | None = None,
        max_restarts: int = 0,
        timeout: float = 120.0,
        start_timeout: float | None = None,
        sync_timings: bool = False,
        cuda_graph: bool = False,
        zero_copy: bool = False,
        restart_workers: int = 0,
    ):
        self._actors: list = []
        self._pg = None
        self._finalizer = None
        self._refs: list = []  # the pending acquisition's, one per actor
        if not isinstance(n_actors, int) or n_actors < 1:
            raise ValueError(f"n_actors must be an int >= 1, got {n_actors!r}")
        if not isinstance(n_processes, int) or n_processes < 0:
            raise ValueError(
                "n_processes must be an int >= 0 (worker processes per actor; 0 runs in the actor), "
                f"got {n_processes!r}"
            )
        per_actor = max(n_processes, 1)
        seeds = self._check_args(
            n_timesteps, timeout, seeds, agent_seeds, n_actors * per_actor, "worker of every actor",
            "n_actors * max(n_processes, 1)", f"actor k takes seeds[k * {per_actor}:(k + 1) * {per_actor}]",
        )
        check_restart_workers(restart_workers)
        if num_cpus is None:
            num_cpus = float(per_actor)
        if not num_cpus > 0:
            raise ValueError(f"num_cpus must be > 0 (fractions allowed), got {num_cpus!r}")
        if num_gpus is not None and not num_gpus >= 0:
            raise ValueError(f"num_gpus must be >= 0 (fractions allowed), got {num_gpus!r}")
        if placement_strategy is not None and placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(
                f"placement_strategy must be one of {list(PLACEMENT_STRATEGIES)} or None, got {placement_strategy!r}"
            )
        if not isinstance(max_restarts, int) or max_restarts < -1:
            raise ValueError(f"max_restarts must be an int >= -1 (-1: unlimited), got {max_restarts!r}")
        if start_timeout is not None and start_timeout <= 0:
            raise ValueError(f"start_timeout must be > 0 seconds or None, got {start_timeout!r}")
        if actor_placements is None:
            placements = [WorkerPlacement(device if actor_device is None else actor_device) for _ in range(n_actors)]
        else:
            placements = list(actor_placements)
            if len(placements) != n_actors:
                raise ValueError(
                    f"actor_placements must hold one WorkerPlacement per actor ({n_actors}), got {len(placements)}"
                )
        if num_gpus is None:
            num_gpus = 1 if any(p.device.type == "cuda" and p.visible_devices is None for p in placements) else 0
        for k, placement in enumerate(placements):
            if placement.cpus is not None:
                raise ValueError(
                    f"actor_placements[{k}] pins cores (cpus={placement.cpus}), which Ray schedules for its actors; "
                    "drop cpus there (num_cpus reserves cores), or pin the actor's worker processes through "
                    "worker_placements"
                )
            if placement.device.type == "cuda" and not num_gpus and placement.visible_devices is None:
                raise ValueError(
                    f"actor {k} runs on {placement.device} but num_gpus=0, so Ray gives it no GPU; pass num_gpus > 0 "
                    "(fractions share a GPU), or a WorkerPlacement with visible_devices in actor_placements"
                )
        if cuda_graph:
            check_graph_placements(placements, "actor", "pass actor_device='cuda' (and num_gpus > 0)")
        self.n_timesteps = n_timesteps
        self.n_actors = n_actors
        self.n_processes = n_processes
        self.device = check_device_exists(device, argument="device")  # where get() returns, in this process
        self.timeout = float(timeout)
        self.max_restarts = max_restarts
        # Starting an actor imports torch and builds its envs, and may wait for the cluster to free resources.
        self._start_timeout = max(self.timeout, 120.0) if start_timeout is None else float(start_timeout)
        agent_info = check_cpu(agent_info, "agent_info")
        env_info = check_cpu(env_info, "env_info")

        ray = self._ray = _import_ray()
        if not ray.is_initialized():
            raise BatcherStateError(
                "RayBatcher needs a running Ray, got none; call ray.init() for a local cluster, or "
                "ray.init(address='ray://<head>:10001') (or address='auto' on a cluster node) first"
            )
        self.restart_workers = restart_workers
        # Each actor's first env and agent seeds, from which the seeds of its restarts are drawn (for the record).
        first_seeds = [(seeds[k * per_actor], None if agent_seeds is None else int(agent_seeds[k * per_actor]))
                       for k in range(n_actors)]
        self._restart_policy = RestartPolicy(max_restarts, per_unit=True, first_seeds=first_seeds, unit="actor")
        self._n_acquisitions = 0
        # What the finalizer closes if this batcher is collected, or the interpreter exits, while open: it must not
        # hold self. Tracked after ray.init's own exit hook, so it runs before Ray shuts down.
        self._held: dict[str, Any] = {"actors": self._actors, "pg": None, "busy": False}
        self._finalizer = track(self, f"RayBatcher with {n_actors} actors", _release_actors, ray, self._held)
        try:
            self._start(
                n_timesteps, create_agent, agent_args, create_env, env_args, seeds, agent_info, env_info,
                agent_seeds, per_actor, worker_placements, placements, num_cpus, num_gpus, placement_strategy,
                runtime_env, sync_timings, cuda_graph, zero_copy,
            )
        except BaseException:
            self.close()
            raise
        self._default_agent_info = agent_info
        self._default_env_info = env_info
        self._version = 0
        self._epoch = 0
        self._weights_ref = None
        self._sent_version = [0] * n_actors  # the weights version each actor was last sent
        self._reset_args: tuple[list, list] | None = None
        self._exec_agent_info: list | None = None
        self._n_running_per_actor = [0] * n_actors
        self._wait_s = 0.0
        self._gather_s = 0.0
        self._actor_timings: list[dict[str, float]] = [{} for _ in range(n_actors)]
        self._retired_timings: dict[str, float] = {}  # what restarted actors had counted before
        self._timing_base: dict[str, float] = {}

    # ----------------------------------------------------------------- setup
    def _start(self, n_timesteps, create_agent, agent_args, create_env, env_args, seeds, agent_info, env_info,
               agent_seeds, per_actor, worker_placements, placements, num_cpus, num_gpus, placement_strategy,
               runtime_env, sync_timings, cuda_graph, zero_copy) -> None:
        ray = self._ray
        strategies: list[Any] = [None] * self.n_actors
        if placement_strategy is not None:
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            bundle = {"CPU": float(num_cpus), **({"GPU": float(num_gpus)} if num_gpus else {})}
            self._pg = placement_group([dict(bundle) for _ in range(self.n_actors)], strategy=placement_strategy)
            self._held["pg"] = self._pg
            ready, _ = ray.wait([self._pg.ready()], timeout=self._start_timeout)
            if not ready:
                raise BatcherWorkerError(
                    f"the placement group of {self.n_actors} bundles {bundle} ({placement_strategy}) could not be "
                    f"placed within {self._start_timeout:g} s; the cluster has {ray.cluster_resources()}: lower "
                    "num_cpus/num_gpus or n_actors, or use a looser placement_strategy"
                )
            strategies = [PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=k)
                          for k in range(self.n_actors)]
        remote_cls = ray.remote(_BatcherActor)
        for k, placement in enumerate(placements):
            environ = placement.environment()
            env = dict(runtime_env or {})
            # A runtime_env makes Ray start a dedicated worker process (about a second more per actor), so a
            # plain CPU actor goes without one: its CUDA_VISIBLE_DEVICES="" is applied in the actor before CUDA.
            if environ != WorkerPlacement("cpu").environment():
                env["env_vars"] = {**env.get("env_vars", {}), **environ}
            options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": self.max_restarts,
                                       "max_task_retries": 0}
            if env:
                options["runtime_env"] = env
            if strategies[k] is not None:
                options["scheduling_strategy"] = strategies[k]
            w = slice(k * per_actor, (k + 1) * per_actor)
            kwargs = dict(
                n_timesteps=n_timesteps, create_agent=create_agent, agent_args=dict(agent_args), create_env=create_env,
                env_args=dict(env_args), n_processes=self.n_processes, seeds=seeds[w], agent_info=agent_info,
                env_info=env_info, agent_seeds=None if agent_seeds is None else list(agent_seeds[w]),
                device=placement.device, worker_placements=worker_placements, timeout=self.timeout,
                sync_timings=sync_timings, cuda_graph=cuda_graph, zero_copy=zero_copy,
                restart_workers=self.restart_workers,
            )
            self._actors.append(remote_cls.options(**options).remote(k, environ, placement.num_threads, kwargs))
        infos = self._wait_all([a.info.remote() for a in self._actors], self._start_timeout, "start")
        self._n_envs = [i["n_envs"] for i in infos]
        self._offsets = [sum(self._n_envs[:k]) for k in range(self.n_actors)]
        self._reports = [i["report"] for i in infos]
        self._specs = infos[0]["specs"]
        for k, info in enumerate(infos[1:], 1):
            if info["specs"] != self._specs:
                diff = sorted(set(info["specs"].items()) ^ set(self._specs.items()), key=str)
                raise BatcherWorkerError(
                    f"actor {k} produces other keys, shapes or dtypes than actor 0: {diff}; every actor must build "
                    "the same kind of env and agent",
                    worker_id=k,
                )

    # ----------------------------------------------------------------- waiting on Ray
    def _error(self, k: int, e: BaseException, what: str) -> BatcherWorkerError:
        ray = self._ray
        if isinstance(e, ray.exceptions.RayActorError) and getattr(e, "actor_init_failed", False):
            # The actor's constructor (this batcher's env or agent factory) raised: Ray's message holds the
            # exception and its traceback, which the driver does not otherwise see (log_to_driver=False).
            tb = _ANSI.sub("", str(e))
            last = [ln for ln in tb.strip().splitlines() if ln.strip()][-1].strip()
            return BatcherWorkerError(
                f"actor {k} failed to start: building its RL_Batcher raised {last}\n--- traceback in actor {k} ---"
                f"\n{tb}",
                worker_id=k,
                remote_traceback=tb,
            )
        if isinstance(e, ray.exceptions.RayActorError):
            return BatcherWorkerError(
                f"actor {k} died during {what} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                "close the batcher and build a new one, or pass max_restarts to have it restarted",
                worker_id=k,
            )
        if isinstance(e, ray.exceptions.RayTaskError):
            cause = getattr(e, "cause", None) or e
            tb = _ANSI.sub("", getattr(e, "traceback_str", None) or str(e))
            return BatcherWorkerError(
                f"actor {k} raised {type(cause).__name__} during {what}: {cause}\n--- traceback in actor {k} ---\n{tb}",
                worker_id=k,
                remote_traceback=tb,
            )
        return BatcherWorkerError(f"actor {k} failed during {what}: {type(e).__name__}: {e}", worker_id=k)

    def _recoverable(self, e: BaseException) -> bool:
        if self.max_restarts == 0:
            return False
        return isinstance(e, (self._ray.exceptions.RayActorError, _StaleActorError))

    def _collect(self, refs: list, timeout: float, what: str, recover: bool = False,
                 owners: list[int] | None = None) -> list[Any]:
        """Every ref's value, or a :class:`_Failed` for those that may be recovered (``recover``).

        ``owners[i]`` is the actor of ``refs[i]`` (default: ref ``i`` is actor ``i mod n_actors``'s). Waits
        for one ref at a time, so that a dead actor is reported at once even while another hangs; any other
        error is raised as a BatcherWorkerError at once.
        """
        ray = self._ray
        owner = owners if owners is not None else [i % self.n_actors for i in range(len(refs))]
        index = {r: i for i, r in enumerate(refs)}
        out: list[Any] = [None] * len(refs)
        pending = list(refs)
        deadline = time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(left, 0.0))
            if not ready:
                k = owner[index[pending[0]]]
                raise BatcherWorkerError(
                    f"actor {k} did not answer within {timeout:g} s during {what}; raise `timeout` if an "
                    "acquisition legitimately takes longer, or look for a hang in the env or agent (or a cluster "
                    "without the resources to place the actor)",
                    worker_id=k,
                )
            for r in ready:
                i = index[r]
                try:
                    out[i] = ray.get(r, timeout=max(deadline - time.monotonic(), 1.0))
                except Exception as e:
                    if recover and self._recoverable(e):
                        out[i] = _Failed(e)
                    else:
                        raise self._error(owner[i], e, what) from None
        return out

    def _wait_all(self, refs: list, timeout: float, what: str) -> list[Any]:
        try:
            return self._collect(refs, timeout, what)
        except BatcherWorkerError as e:
            self._fail(e)
            raise

    def _weights_for(self, k: int) -> tuple[int, Any]:
        """The version to expect from actor ``k`` and, if it has not been sent that version, its reference."""
        if self._sent_version[k] == self._version:
            return self._version, None
        self._sent_version[k] = self._version
        return self._version, self._weights_ref

    # ----------------------------------------------------------------- API
    @property
    def actors(self) -> list:
        """The Ray actor handles, actor 0 first (to inspect them; :meth:`close` kills them)."""
        return list(self._actors)

    def n_elems(self) -> int:
        """The total number of envs, ``sum over actors of their RL_Batcher's n_elems()``."""
        return sum(self._n_envs)

    def reset(self, agent_info: DictTensor | None = None, env_info: DictTensor | None = None) -> None:
        """Restarts every env and forgets the carried agent state (blocking); as :meth:`RL_Batcher.reset`.

        Raises:
            BatcherStateError: an ``execute`` is pending, or the batcher is closed or failed.
            BatcherWorkerError: an actor failed (here or in a previous ``update``).
        """
        self._enter("reset")
        ai, ei = self._reset_rows(agent_info, env_info)
        self._epoch += 1
        ais, eis = self._split(ai), self._split(ei)
        self._wait_all([a.reset.remote(*self._weights_for(k), self._epoch, x, y)
                        for k, (a, x, y) in enumerate(zip(self._actors, ais, eis))], self.timeout, "reset")
        self._reset_args = (ais, eis)
        self._exec_agent_info = None
        self._n_running_per_actor = list(self._n_envs)
        self._to(Phase.READY)

    def execute(self, agent_info: DictTensor | None = None) -> None:
        """Starts one acquisition on every actor and returns at once; as :meth:`RL_Batcher.execute`.

        Raises:
            BatcherStateError: no ``reset`` yet, an ``execute`` already pending, or every env finished.
        """
        self._enter("execute")
        ai = self._check_rows(agent_info, "agent_info", "agent_info/") if agent_info is not None else None
        parts: list = self._split(ai) if ai is not None and not ai.empty() else [None] * self.n_actors
        if parts[0] is not None:
            self._exec_agent_info = parts
        self._n_acquisitions += 1
        self._refs = [a.acquire.remote(*self._weights_for(k), self._epoch, p)
                      for k, (a, p) in enumerate(zip(self._actors, parts))]
        self._held["busy"] = True
        self._to(Phase.PENDING)

    def get(self, blocking: bool = True) -> tuple[Trajectories, int] | tuple[None, None]:
        """The trajectories of the pending ``execute``; as :meth:`RL_Batcher.get`.

        Returns:
            ``(trajectories, n_still_running)`` on ``device``, or ``(None, None)`` when ``blocking=False`` and
            some actor has not answered yet.

        Raises:
            BatcherStateError: nothing is pending.
            BatcherWorkerError: an actor raised, died (and may not be restarted), or did not answer within
                ``timeout``.
        """
        self._enter("get")
        ray = self._ray
        if not blocking:
            _, not_ready = ray.wait(self._refs, num_returns=len(self._refs), timeout=0)
            if not_ready:
                return None, None
        t0 = time.perf_counter()
        try:
            replies = self._collect(self._refs, self.timeout, "execute", recover=True)
            for k, r in enumerate(replies):
                if isinstance(r, _Failed):
                    replies[k] = self._recover(k, r.error)
        except BatcherWorkerError as e:
            self._fail(e)
            raise
        t1 = time.perf_counter()
        self._refs = []
        self._wait_s += t1 - t0
        for k, r in enumerate(replies):
            if r is not None:
                self._actor_timings[k] = r["timings"]
                self._n_running_per_actor[k] = r["n_running"]
        n_running = sum(self._n_running_per_actor)
        self._held["busy"] = False
        self._got(n_running)
        out = _rebuild([None if r is None else r["wire"] for r in replies], self.device)
        self._gather_s += time.perf_counter() - t1
        return out, n_running

    def _recover(self, k: int, error: BaseException) -> dict[str, Any] | None:
        """Restores actor ``k`` after Ray restarted it, and collects its rows again."""
        policy = self._restart_policy
        if not policy.allows(k):
            raise self._error(k, error, "execute")
        policy.admit(k, error, self._n_acquisitions, "get")
        n = policy.count(k)
        assert self._reset_args is not None
        ais, eis = self._reset_args
        ai = self._exec_agent_info[k] if self._exec_agent_info is not None else ais[k]
        actor = self._actors[k]
        for key, v in self._actor_timings[k].items():  # the new incarnation counts from zero
            self._retired_timings[key] = self._retired_timings.get(key, 0.0) + v
        self._actor_timings[k] = {}
        # A restarted actor holds the weights it was built with: send the latest ones whatever it was sent.
        self._sent_version[k] = self._version
        restore = (n, self._version, self._weights_ref, self._epoch, ai, eis[k])
        deadline = time.monotonic() + self._start_timeout
        while True:
            # While Ray restarts the actor, calls fail as "unavailable": retry them until it is back.
            got = self._collect([actor.restore.remote(*restore)], self._start_timeout, f"the restart of actor {k}",
                                recover=True, owners=[k])[0]
            if not isinstance(got, _Failed):
                break
            if (not isinstance(got.error, self._ray.exceptions.ActorUnavailableError)
                    or time.monotonic() > deadline):
                raise BatcherWorkerError(
                    f"actor {k} died and could not be restored (max_restarts={self.max_restarts}): "
                    f"{self._error(k, got.error, 'its restart')}",
                    worker_id=k,
                )
            time.sleep(0.1)
        info, reply = self._collect([actor.info.remote(), actor.acquire.remote(self._version, None, self._epoch, None)],
                                    self.timeout, "execute", owners=[k, k])
        self._reports[k] = info["report"]
        return reply

    def update(self, state_dict: Any) -> None:
        """Sends weights (a CPU ``state_dict``) to every actor through the object store, once.

        Returns as soon as the weights are in the object store; their reference and version ride on each
        actor's next ``reset`` or acquisition, which applies them first (one Ray call per actor per
        collection), and an error applying them surfaces at that ``get``/``reset``.

        Raises:
            BatcherStateError: an ``execute`` is pending.
            DeviceMismatchError: a tensor of ``state_dict`` is not on the CPU.
        """
        self._enter("update")
        check_cpu_state_dict(state_dict)
        self._version += 1
        # Once into the object store; each actor gets the reference with its next reset or acquisition.
        self._weights_ref = self._ray.put(_to_wire(state_dict))

    def timings(self) -> dict[str, float]:
        """Seconds per phase since the last :meth:`reset_timings`, and step counts; RL_Batcher's keys.

        ``agent_forward``, ``env_step``, ``buffer_write``, ``copy``, ``steps`` and ``env_steps`` are summed
        over every worker of every actor; ``wait`` is the driver's time blocked in ``get`` (Ray included) and
        ``gather`` its time rebuilding the result; ``actor_wait`` and ``actor_gather`` are the actors' own
        ``wait``/``gather``, summed. With in-process actors (``n_processes=0``), ``wait`` less the per-actor
        step-loop time (the four phases over ``n_actors``) approximates what Ray adds.
        """
        total: dict[str, float] = {p: 0.0 for p in (*PHASES, "steps", "env_steps", "actor_wait", "actor_gather")}
        for at in (*self._actor_timings, self._retired_timings):
            for k, v in at.items():
                key = {"wait": "actor_wait", "gather": "actor_gather"}.get(k, k)
                total[key] = total.get(key, 0.0) + v
        total["wait"] = self._wait_s
        total["gather"] = self._gather_s
        return {k: v - self._timing_base.get(k, 0.0) for k, v in total.items()}

    def worker_reports(self) -> list[dict[str, Any]]:
        """One report per actor: pid, node, the accelerators Ray assigned, CUDA variables, whether CUDA was
        initialised, restarts, and its RL_Batcher's ``worker_reports()`` under ``workers``."""
        return [{**r, "restarts": self._restart_policy.count(k)} for k, r in enumerate(self._reports)]

    @property
    def restarts(self) -> list[WorkerRestart]:
        """Every restore of a dead actor, in order (see ``max_restarts``)."""
        return self._restart_policy.records

    @property
    def n_restarts(self) -> int:
        """How many dead actors have been restored (see ``max_restarts`` and :attr:`restarts`; the worker restarts
        of each actor's RL_Batcher, ``restart_workers``, are its own)."""
        return len(self.restarts)

    def close(self) -> None:
        """Closes every actor's RL_Batcher, kills the actors and removes the placement group; idempotent."""
        busy = self._busy()
        untrack(getattr(self, "_finalizer", None))
        if not self._closing():
            return
        _close_actors(getattr(self, "_ray", None), self._actors, self._pg, busy)
        self._actors = []
        self._pg = None
        self._refs = []

    def __enter__(self) -> RayBatcher:
        return self


def _close_actors(ray: Any, actors: list, pg: Any, busy: bool) -> None:
    """Closes every actor's RL_Batcher (waiting less for ``busy`` ones), kills them and removes ``pg``."""
    live = list(actors)
    actors.clear()  # the batcher's own list, also the finalizer's: nothing is closed twice
    try:
        connected = ray is not None and ray.is_initialized()
    except Exception:  # the interpreter is shutting down
        connected = False
    if not connected:
        # Without a connection there is nothing to kill: Ray ends a job's actors when its driver disconnects.
        return
    if live:
        # An actor busy in an acquisition (or hung) cannot run close() soon: do not wait long for it.
        grace = 1.0 if busy else 5.0
        try:
            ray.wait([a.close.remote() for a in live], num_returns=len(live), timeout=grace)
        except Exception as e:  # dead actors: they are killed below all the same
            log.debug("errors while closing actors: %s", e)
        for a in live:
            try:
                ray.kill(a, no_restart=True)
            except Exception as e:
                log.warning("could not kill actor %s: %s", a, e)
    if pg is not None:
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(pg)
        except Exception as e:
            log.warning("could not remove the placement group: %s", e)


def _release_actors(ray: Any, held: dict[str, Any]) -> None:
    """Closes the actors of a RayBatcher its program did not close (see ``_lifecycle``)."""
    _close_actors(ray, held["actors"], held["pg"], held["busy"])
    held["pg"] = None


def _temporal_size(wire: dict[str, Any]) -> int:
    for k, a in wire["arrays"].items():
        if k.startswith(TEMPORAL_PREFIXES):
            return a.shape[1]
    return 0


def _rebuild(wires: list[dict[str, Any] | None], device: torch.device) -> Trajectories:
    """The Trajectories of every actor's result, actor 0's rows first (``None``: an actor with no rows).

    Time is zero-padded to the longest acquisition (beyond ``lengths``, like RL_Batcher's padding).
    """
    present = [w for w in wires if w is not None]
    dtypes = present[0]["dtypes"]
    T = max(_temporal_size(w) for w in present)
    data: dict[str, torch.Tensor] = {}
    for key in present[0]["arrays"]:
        parts = [w["arrays"][key] for w in present]
        if key.startswith(TEMPORAL_PREFIXES) and any(p.shape[1] != T for p in parts):
            out = np.zeros((sum(p.shape[0] for p in parts), T) + parts[0].shape[2:], dtype=parts[0].dtype)
            o = 0
            for p in parts:
                out[o:o + p.shape[0], :p.shape[1]] = p
                o += p.shape[0]
        else:
            # The one copy out of the object store: the result must outlive the Ray references.
            out = np.concatenate(parts, axis=0)
        data[key] = _numpy_to_tensor(out, dtypes.get(key)).to(device)
    return trajectories_from(data)
