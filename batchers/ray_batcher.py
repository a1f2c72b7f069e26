"""RayBatcher: RL_Batcher's API over Ray actors, each hosting a local RL_Batcher (extra ``rlstruct[ray]``).

This module imports without Ray; Ray is imported when a RayBatcher is built.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from rlstruct.batchers._acquire import PHASES
from rlstruct.batchers._args import BatcherArgs, check_cpu_state_dict
from rlstruct.batchers._base import BatcherBase, Phase, same_specs
from rlstruct.batchers._lifecycle import track, untrack
from rlstruct.batchers._placement import WorkerPlacement
from rlstruct.batchers._protocol import KEPT_ERRORS
from rlstruct.batchers._ray_actor import BatcherActor, StaleActorError, close_actors, import_ray, release_actors
from rlstruct.batchers._restart import RestartPolicy
from rlstruct.batchers._wire import rebuild, to_wire
from rlstruct.devices import DeviceLike
from rlstruct.errors import BatcherStateError, BatcherWorkerError
from rlstruct.structures import DictTensor, Trajectories

__all__ = ["RayBatcher", "PLACEMENT_STRATEGIES"]

log = logging.getLogger(__name__)

#: Ray placement-group strategies accepted by ``placement_strategy`` (``None``: no placement group).
PLACEMENT_STRATEGIES = ("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the tracebacks it formats


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
            first; or one int, the batcher's seed, as for RL_Batcher: actor ``k`` steps the envs that follow actor
            ``k - 1``'s, the same trajectories as one RL_Batcher of all the workers.
        agent_info: example ``agent_info`` (CPU), as for RL_Batcher.
        env_info: example ``env_info`` (CPU), as for RL_Batcher.
        agent_seeds: one agent seed per worker of every actor, or ``None``; one int with one seed.
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
            episodes (never exactly: the actor's state would have to be kept at the driver); each restore is logged
            as a warning and recorded in :attr:`restarts`.
        restart_workers: passed to each actor's RL_Batcher: how many of its failed worker processes it may
            replace (see :class:`RL_Batcher`; exactly with one seed and envs with state), within the actor, without
            Ray restarting the actor.
        timeout: seconds any wait on an actor may last (and on a worker of an actor's RL_Batcher).
        start_timeout: seconds to place and start the actors (their RL_Batchers' start included, which this bounds
            too), or to restore a restarted one (default ``max(timeout, 120)``).
        sync_timings: passed to each actor's RL_Batcher.
        cuda_graph: passed to each actor's RL_Batcher (every actor, and every worker of it, on a GPU): each
            worker replays its acquisitions as one CUDA graph.
        zero_copy: passed to each actor's RL_Batcher (its result is copied into the object store anyway).
        env_index: with one seed, the global index of the first env of this batcher's first actor (actor ``k``'s
            RL_Batcher starts after the envs of the actors before it), for a batcher that steps part of a larger set
            of envs (a data-parallel rank's); ``0`` otherwise.

    Raises:
        MissingDependencyError: Ray is not installed.
        BatcherStateError: Ray is not initialised.
        ValueError: an argument out of its range (as for RL_Batcher; ``num_cpus``, ``num_gpus``,
            ``placement_strategy``, ``max_restarts``, ``actor_placements`` of RayBatcher's own).
        TypeError: as for RL_Batcher (``create_agent``/``create_env`` an instance, ``agent_args``/``env_args`` not
            a dict, ...).
        ConfigError: ``seeds`` or ``agent_seeds`` does not hold one seed per worker of every actor, or ``seeds``
            repeats one.
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
        seeds: Sequence[int] | int,
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
        env_index: int = 0,
    ):
        self._actors: list = []
        self._pg = None
        self._finalizer = None
        self._refs: list = []  # the pending acquisition's, one per actor
        if not isinstance(n_actors, int) or n_actors < 1:
            raise ValueError(f"n_actors must be an int >= 1, got {n_actors!r}")
        args = BatcherArgs.check(n_timesteps, create_agent, agent_args, create_env, env_args, n_processes, seeds,
                                 agent_info, env_info, agent_seeds, device, worker_placements, timeout, sync_timings,
                                 cuda_graph, zero_copy, restart_workers, start_timeout=start_timeout,
                                 n_actors=n_actors, env_index=env_index)
        if num_cpus is None:
            num_cpus = float(max(n_processes, 1))
        if actor_placements is None:
            actor_device = args.device if actor_device is None else actor_device
            placements = [WorkerPlacement(actor_device) for _ in range(n_actors)]
        else:
            placements = list(actor_placements)
        if num_gpus is None:
            num_gpus = 1 if any(p.device.type == "cuda" and p.visible_devices is None for p in placements) else 0
        _check_ray_options(n_actors, placements, num_cpus, num_gpus, placement_strategy, max_restarts)
        args.check_placements(placements, "actor", "pass actor_device='cuda' (and num_gpus > 0)")
        self._keep(args)  # device: where get() returns, in this process
        self.n_actors = n_actors
        self.max_restarts = max_restarts
        # Starting an actor imports torch and builds its envs, and may wait for the cluster to free resources.
        self._start_timeout = args.start_timeout

        ray = self._ray = import_ray()
        if not ray.is_initialized():
            raise BatcherStateError(
                "RayBatcher needs a running Ray, got none; call ray.init() for a local cluster, or "
                "ray.init(address='ray://<head>:10001') (or address='auto' on a cluster node) first"
            )
        self._restart_policy = RestartPolicy(max_restarts, per_unit=True, first_seeds=args.first_seeds(n_actors),
                                             unit="actor")
        # What the finalizer closes if this batcher is collected, or the interpreter exits, while open: it must not
        # hold self. Tracked after ray.init's own exit hook, so it runs before Ray shuts down.
        self._held: dict[str, Any] = {"actors": self._actors, "pg": None, "busy": False}
        self._finalizer = track(self, f"RayBatcher with {n_actors} actors", release_actors, ray, self._held)
        try:
            self._start(args, placements, num_cpus, num_gpus, placement_strategy, runtime_env)
        except BaseException:
            self.close()
            raise
        self._version = 0
        self._epoch = 0
        self._weights_ref = None
        self._sent_version = [0] * n_actors  # the weights version each actor was last sent
        self._reset_args: tuple[list, list] | None = None
        self._exec_agent_info: list | None = None
        self._n_running_per_actor = [0] * n_actors
        self._actor_timings: list[dict[str, float]] = [{} for _ in range(n_actors)]
        self._retired_timings: dict[str, float] = {}  # what restarted actors had counted before

    def _start(self, args: BatcherArgs, placements: list[WorkerPlacement], num_cpus: float, num_gpus: float,
               placement_strategy: str | None, runtime_env: dict | None) -> None:
        """Places the actors (through a placement group with a ``placement_strategy``) and waits for them to
        start."""
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
        remote_cls = ray.remote(BatcherActor)
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
            kwargs = args.for_actor(k, self.n_actors, placement.device)
            self._actors.append(remote_cls.options(**options).remote(k, environ, placement.num_threads, kwargs))
        infos = self._wait_all([a.info.remote() for a in self._actors], self._start_timeout, "start")
        self._n_envs = [i["n_envs"] for i in infos]
        self._offsets = [sum(self._n_envs[:k]) for k in range(self.n_actors)]
        self._reports = [i["report"] for i in infos]
        self._specs = same_specs([i["specs"] for i in infos], "actor")

    def _error(self, k: int, e: BaseException, what: str) -> Exception:
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
            kept = next((t for t in KEPT_ERRORS if isinstance(cause, t)), None)
            if kept is not None:
                return kept(f"actor {k}: {cause}")
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
        return isinstance(e, (self._ray.exceptions.RayActorError, StaleActorError))

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
        except (BatcherWorkerError, *KEPT_ERRORS) as e:
            self._fail(e)
            raise

    def _weights_for(self, k: int) -> tuple[int, Any]:
        """The version to expect from actor ``k`` and, if it has not been sent that version, its reference."""
        if self._sent_version[k] == self._version:
            return self._version, None
        self._sent_version[k] = self._version
        return self._version, self._weights_ref

    @property
    def actors(self) -> list:
        """The Ray actor handles, actor 0 first (to inspect them; :meth:`close` kills them)."""
        return list(self._actors)

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
        except (BatcherWorkerError, *KEPT_ERRORS) as e:
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
        out = rebuild([None if r is None else r["wire"] for r in replies], self.device)
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
        self._weights_ref = self._ray.put(to_wire(state_dict))

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

    def close(self) -> None:
        """Closes every actor's RL_Batcher, kills the actors and removes the placement group; idempotent."""
        busy = self._busy()
        untrack(getattr(self, "_finalizer", None))
        if not self._closing():
            return
        close_actors(getattr(self, "_ray", None), self._actors, self._pg, busy)
        self._actors = []
        self._pg = None
        self._refs = []


def _check_ray_options(n_actors: int, placements: list[WorkerPlacement], num_cpus: float, num_gpus: float,
                       placement_strategy: str | None, max_restarts: int) -> None:
    """Raises ValueError for a RayBatcher argument of its own (not RL_Batcher's) that Ray would refuse or that
    could not place the actors as asked."""
    if not num_cpus > 0:
        raise ValueError(f"num_cpus must be > 0 (fractions allowed), got {num_cpus!r}")
    if not num_gpus >= 0:
        raise ValueError(f"num_gpus must be >= 0 (fractions allowed), got {num_gpus!r}")
    if placement_strategy is not None and placement_strategy not in PLACEMENT_STRATEGIES:
        raise ValueError(
            f"placement_strategy must be one of {list(PLACEMENT_STRATEGIES)} or None, got {placement_strategy!r}"
        )
    if not isinstance(max_restarts, int) or max_restarts < -1:
        raise ValueError(f"max_restarts must be an int >= -1 (-1: unlimited), got {max_restarts!r}")
    if len(placements) != n_actors:
        raise ValueError(
            f"actor_placements must hold one WorkerPlacement per actor ({n_actors}), got {len(placements)}"
        )
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
