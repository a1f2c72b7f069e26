"""RL_Batcher: one API over CPU worker processes, a GPU worker process, or the calling process."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlstruct.batchers._acquire import PHASES
from rlstruct.batchers._args import BatcherArgs, check_cpu_state_dict
from rlstruct.batchers._base import BatcherBase, Phase, repeat_first, same_specs
from rlstruct.batchers._buffer import Part, Specs, allocate_block, gather, rows_of, trajectories_from, views_of
from rlstruct.batchers._lifecycle import track, untrack
from rlstruct.batchers._local import LocalWorker
from rlstruct.batchers._parent import ProcessWorker, close_workers, recv_all
from rlstruct.batchers._placement import WorkerPlacement
from rlstruct.batchers._protocol import CHECK_DEVICE_ENV, Command, WorkerSpec
from rlstruct.batchers._replace import ABANDON_GRACE_S, CLOSE_GRACE_S, WorkerReplacement
from rlstruct.batchers._restart import RestartPolicy
from rlstruct.batchers.weights import dump_weights
from rlstruct.devices import DeviceLike, tree_copy
from rlstruct.errors import BatcherStateError, BatcherWorkerError, ConfigError
from rlstruct.structures import DictTensor, Trajectories

__all__ = ["RL_Batcher"]

log = logging.getLogger(__name__)

def _release_workers(workers: list, busy: list[bool]) -> None:
    """Closes workers abandoned by their batcher (garbage collection or interpreter exit; see ``_lifecycle``);
    ``busy[0]``: an acquisition is pending, whose result nobody will read."""
    grace = ABANDON_GRACE_S if busy[0] else CLOSE_GRACE_S
    errors = close_workers(workers, grace, stop_grace=CLOSE_GRACE_S)
    workers.clear()
    if errors:
        # Expected when an acquisition was under way (its worker was stopped): the ResourceWarning said the rest.
        log.info("while closing the workers of an unclosed batcher: %s", errors)


class RL_Batcher(WorkerReplacement, BatcherBase):
    """Collects trajectories of an agent on vectorized environments, in worker processes or in this process.

    The call order is ``reset`` → ``execute`` (returns at once) → ``get`` → ``(Trajectories, n_still_running)``;
    ``update`` sends weights while nothing is pending. Env and agent state carry over between executes until the
    next ``reset``. Each ``execute`` yields one trajectory per env running when it started, of at most
    ``n_timesteps`` steps, on ``device``: ``info`` holds ``agent_info/*``, ``env_info/*`` and ``agent_state/*`` (the
    state when the acquisition started), ``trajectories`` holds ``observation/*`` (step t), ``action/*`` (every key
    the agent returned at t) and ``_observation/*`` (step t+1, before any auto-reset); rows are worker 0's running
    envs, then worker 1's, and so on. The docs' Batchers page describes the modes, CUDA graphs, ``zero_copy`` and
    restarts at length.

    Args:
        n_timesteps: steps per acquisition (the ``T`` of the buffer).
        create_agent: ``create_agent(**agent_args)`` builds a worker's agent (picklable with processes).
        agent_args: keyword arguments of ``create_agent``.
        create_env: ``create_env(**env_args, seed=seeds[k])`` builds worker k's VecEnv; with one seed,
            ``create_env(**env_args, seed=seeds, env_index=i)``, ``i`` the global index of the worker's first env
            (:func:`~rlstruct.envs.make_env` and the simulators take it).
        env_args: keyword arguments of ``create_env`` (a ``seed`` key is overridden): each worker's, so that a
            worker's ``n_envs`` is its own envs (as in rlstructures).
        n_processes: spawned worker processes, writing into one shared buffer; 0 runs in the calling process.
        seeds: one env seed per worker (``max(n_processes, 1)`` of them), each worker's envs seeded apart; or one
            int, the batcher's seed: worker ``k`` steps envs ``env_index + k * n_envs, ...`` of that seed (``n_envs``
            from ``env_args``), so that env ``i``'s episodes and the agent's draws for it do not depend on which
            process steps it: the same trajectories in process and over any number of workers.
        agent_info: example ``agent_info`` (CPU): its keys and row shapes size the buffer, and its first row
            repeated is the default of ``reset``. May be empty.
        env_info: example ``env_info`` (CPU), likewise.
        agent_seeds: one seed per worker for ``agent.seed`` (also seeds the worker's global torch RNG); with one
            seed in ``seeds``, one int for every worker's ``agent.seed_envs(agent_seeds, i)``, ``i`` as above.
        device: where observations, agent state, actions and the output live.
        worker_placements: one :class:`WorkerPlacement` per worker (its device, a GPU index, a MIG slice, MPS
            settings, its CPU cores). Default: every worker on ``device``.
        timeout: seconds any wait on a worker may last before it is reported as hung, from the first ``reset`` on.
        start_timeout: the same while the batcher starts (spawning the workers, which import torch, building their
            envs and agents, and the agent's first call, which sizes the buffer); default ``max(timeout, 120)``.
        sync_timings: synchronize the device between phases so that :meth:`timings` is exact on a GPU.
        cuda_graph: replay each worker's whole step loop (agent, env step, buffer writes) as one CUDA graph,
            captured at the second acquisition. Needs every worker on a CUDA device and an auto-reset torch
            simulator (an env with :meth:`~rlstruct.envs.VecEnv.graph_state`); only device work is replayed.
        zero_copy: let ``get`` return views of a double buffer instead of copies, valid until the second
            ``execute`` after it. Applies where this process allocates the buffer on ``device``, without
            ``cuda_graph``, and when every env ran; otherwise ``get`` copies as usual.
        restart_workers: how many times in all a failed worker (one that raised, died or hung) may be replaced by
            a fresh one instead of failing the batcher (0: the first failure raises). With one seed and envs with
            ``get_state`` (the torch simulators), each worker keeps its state at every call's end in memory this
            process owns, and the new worker takes the same seeds and that state: it collects the same steps as if
            nothing had failed. Otherwise it gets :func:`~rlstruct.batchers.restart_seed` seeds and a reset. Either
            way it gets the last weights and collects its rows of the failed acquisition again; each replacement
            is recorded in :attr:`restarts`. A worker that fails while the batcher starts is replaced too, with
            the same seeds.
        env_index: with one seed, the global index of this batcher's first env, for a batcher that steps part of a
            larger set of envs (a Ray actor's, a data-parallel rank's); ``0`` otherwise.

    It closes itself, with a ``ResourceWarning`` naming where it was created, when garbage-collected or at
    interpreter exit while still open: call :meth:`close` or use ``with``.

    Raises:
        ConfigError: ``seeds`` or ``agent_seeds`` does not hold one seed per worker, or ``seeds`` repeats one; one
            seed with ``env_args`` that has no int ``n_envs``.
        SeedError: a seed of ``seeds`` or ``agent_seeds`` is not an int in ``[0, 2**31)``.
        TypeError: ``n_timesteps`` not an int, ``timeout``/``start_timeout`` not a number, ``seeds`` not a sequence,
            ``create_agent``/``create_env`` an instance (an agent, an env, ``gym.make(...)``) rather than a class
            or function, ``agent_args``/``env_args`` not a dict, or (with worker processes) ``create_env``,
            ``create_agent``, ``env_args`` or ``agent_args`` not picklable.
        AgentOutputError: the agent's first call (the probe) returned something other than ``(output,
            new_state)``, two DictTensors.
        ValueError: ``n_timesteps < 1``, ``timeout <= 0``, ``start_timeout <= 0``, or ``cuda_graph=True`` with a
            worker off the GPU.
        DeviceUnavailableError: ``device`` does not exist on this machine.
        DeviceMismatchError: ``agent_info``/``env_info`` not on the CPU.
        BatchSizeError: ``agent_info``/``env_info`` with a 0-d tensor or no row.
        BatcherWorkerError: a worker failed to start, probe or allocate (with ``cuda_graph``: its env cannot be
            captured, or capturing failed), or did not start within ``start_timeout`` (a ``BatcherWorkerTimeout``).

    >>> from rlstruct import RL_Agent
    >>> from rlstruct.envs import CartPole
    >>> class Left(RL_Agent):
    ...     def __call__(self, state, observation, agent_info, history=None):
    ...         return DictTensor({"action": torch.zeros(observation.n_elems(), dtype=torch.long)}), state
    >>> with RL_Batcher(8, Left, {}, CartPole, {"n_envs": 4, "autoreset": True}, 0, [0]) as b:
    ...     b.reset(); b.execute(); traj, n = b.get()
    >>> traj.trajectories["observation/frame"].shape, n
    (torch.Size([4, 8, 4]), 4)
    """

    _name = "RL_Batcher"
    _unit = "a worker"
    _rows = "n_processes * n_envs"

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
        worker_placements: Sequence[WorkerPlacement] | None = None,
        timeout: float = 120.0,
        start_timeout: float | None = None,
        sync_timings: bool = False,
        cuda_graph: bool = False,
        zero_copy: bool = False,
        restart_workers: int = 0,
        env_index: int = 0,
    ):
        self._workers: list = []
        self._finalizer = None
        self._blocks: list[list[dict[str, torch.Tensor]]] = []
        self._whole: list[dict[str, torch.Tensor]] | None = None
        self._views = False
        self._slot = 0
        self._copy_done: torch.cuda.Event | None = None
        args = BatcherArgs.check(n_timesteps, create_agent, agent_args, create_env, env_args, n_processes, seeds,
                                 agent_info, env_info, agent_seeds, device, worker_placements, timeout, sync_timings,
                                 cuda_graph, zero_copy, restart_workers, start_timeout=start_timeout,
                                 env_index=env_index)
        self._keep(args)
        self.cuda_graph = args.cuda_graph
        self._start_timeout = args.start_timeout
        n_workers = max(n_processes, 1)
        placements = args.worker_placements
        if placements is None:
            placements = [WorkerPlacement(self.device) for _ in range(n_workers)]
        elif len(placements) != n_workers:
            raise ValueError(
                f"worker_placements must hold one WorkerPlacement per worker ({n_workers}), got {len(placements)}"
            )
        args.check_placements(placements, "worker", "pass device='cuda' (or GPU worker_placements)")
        check_device = os.environ.get(CHECK_DEVICE_ENV, "") not in ("", "0")
        self._Worker = ProcessWorker if n_processes >= 1 else LocalWorker
        self._restart_policy = RestartPolicy(restart_workers, per_unit=False, first_seeds=args.first_seeds(n_workers),
                                             unit="worker")
        self._weights: Any = None  # what the last update() sent, for a restarted worker
        self._boundary = 0  # resets and acquisitions started: the boundary each worker's kept state is stamped with
        self._reset_parts: tuple[list[DictTensor], list[DictTensor]] | None = None
        # Tracked before any process starts: a constructor interrupted halfway still stops what it started.
        what = f"RL_Batcher with {n_processes} worker processes" if n_processes else "RL_Batcher (in process)"
        self._busy_box = [False]  # an acquisition pending, for the finalizer (which must not hold self)
        self._finalizer = track(self, what, _release_workers, self._workers, self._busy_box)
        self._worker_specs = [
            WorkerSpec(k, args.create_env, args.env_args, args.seeds[k], args.create_agent, args.agent_args,
                       None if args.agent_seeds is None else args.agent_seeds[k], n_timesteps, placements[k],
                       check_device, args.sync_timings, args.cuda_graph, args.worker_env_index(k))
            for k in range(n_workers)
        ]
        try:
            ready = self._start_workers()
            self._n_envs = [r["n_envs"] for r in ready]
            if args.seed is not None and any(n != args.envs_per_worker for n in self._n_envs):
                k = next(k for k, n in enumerate(self._n_envs) if n != args.envs_per_worker)
                raise ConfigError(
                    f"with one seed, worker {k}'s create_env must build env_args['n_envs'] = {args.envs_per_worker} "
                    f"envs (its first env's global index counts on it), got {self._n_envs[k]}; build n_envs envs, or "
                    "pass one seed per worker"
                )
            self._reports = [r["report"] for r in ready]
            self._offsets = [sum(self._n_envs[:k]) for k in range(n_workers)]
            self._specs = self._probe(args.agent_info, args.env_info)
            self._bind(args.zero_copy)
            self._start_carries(args.seed is not None)
        except BaseException:
            self.close()
            raise
        self._worker_timings: list[dict[str, float]] = [{} for _ in self._workers]

    # ----------------------------------------------------------------- setup
    def _probe(self, agent_info: DictTensor, env_info: DictTensor) -> Specs:
        for w, n in zip(self._workers, self._n_envs):
            w.send(Command.PROBE, repeat_first(agent_info, n), repeat_first(env_info, n))
        specs = same_specs(recv_all(self._workers, self._start_timeout, "start_timeout"), "worker")
        log.debug("buffer specs: %s", specs)
        return specs

    def _bind(self, zero_copy: bool) -> None:
        """Allocates the buffers and gives each worker its rows (``self._blocks[slot][k]``: worker k's).

        Where this process allocates every worker's buffer (CPU workers, or the in-process one), it is one buffer
        per key for all workers, ``[n_timesteps, n_elems(), ...]``, of which worker ``k`` writes its
        ``n_envs[k]`` rows from ``offsets[k]`` on: ``get`` moves each key in one copy, or, with ``zero_copy``,
        hands the buffer out as views and lets the next acquisition write into a second one. GPU worker
        processes allocate their own, on their device (shared with this process through CUDA IPC).
        """
        T = self.n_timesteps
        if self.n_processes == 0 or all(w.device.type == "cpu" for w in self._workers):
            dev = self._workers[0].device
            self._views = zero_copy and dev == self.device and not self.cuda_graph
            self._whole = [
                allocate_block(self._specs, self.n_elems(), T, dev, shared=self.n_processes > 0)
                for _ in range(2 if self._views else 1)
            ]
            self._blocks = [
                [rows_of(whole, off, n) for off, n in zip(self._offsets, self._n_envs)] for whole in self._whole
            ]
            for k, w in enumerate(self._workers):
                w.send(Command.BIND, [blocks[k] for blocks in self._blocks])
            recv_all(self._workers, self._start_timeout, "start_timeout")
            return
        blocks: list[dict[str, torch.Tensor] | None] = []
        for w, n in zip(self._workers, self._n_envs):
            if w.device.type == "cuda":
                w.send(Command.BIND, None)  # the worker allocates on its GPU and shares it (CUDA IPC)
                blocks.append(None)
            else:
                block = allocate_block(self._specs, n, T, w.device, shared=True)
                w.send(Command.BIND, [block])
                blocks.append(block)
        for k, got in enumerate(recv_all(self._workers, self._start_timeout, "start_timeout")):
            if blocks[k] is None:
                blocks[k] = got
        self._blocks = [blocks]  # type: ignore[list-item]

    def _call_all(self, method: str, command: Command, args_per_worker: Sequence[tuple]) -> list[Any]:
        """Sends ``command`` to every worker (worker k with ``args_per_worker[k]``) and waits for every reply; on
        behalf of ``method``, which fails the batcher if anything escapes (see ``_exchange``)."""
        with self._exchange(method):
            self._send_all(command, args_per_worker)
            return self._replies(method, command, args_per_worker)

    def _send_all(self, command: Command, args_per_worker: Sequence[tuple]) -> None:
        for w, args in zip(self._workers, args_per_worker):
            try:
                w.send(command, *args)
            except BatcherWorkerError:
                if self.restart_workers == 0:
                    raise
                # Dead since its last reply: waiting for this reply finds it dead and replaces it.

    # ----------------------------------------------------------------- API
    def reset(self, agent_info: DictTensor | None = None, env_info: DictTensor | None = None) -> None:
        """Restarts every env and forgets the carried agent state (blocking).

        Args:
            agent_info: CPU, ``n_elems()`` rows, or ``None``/empty for the constructor example's first row.
            env_info: likewise; row ``i`` parametrises env ``i``.

        Raises:
            BatcherStateError: an ``execute`` is pending, or the batcher is closed or failed.
            BatcherWorkerError: a worker raised, died, or did not answer within ``timeout`` (the batcher fails).

        Whatever interrupts it (``KeyboardInterrupt``, ``SystemExit``) is re-raised unchanged and fails the batcher,
        as during :meth:`update`, :meth:`get`, and an in-process :meth:`execute`: the workers' replies are then out of
        step, so only :meth:`close` is left.
        """
        self._enter("reset")
        ai, ei = self._reset_rows(agent_info, env_info)
        ais, eis = self._split(ai), self._split(ei)
        self._reset_parts = (ais, eis)  # before the call: a worker restarted during it is reset with them
        self._boundary += 1
        self._call_all("reset", Command.RESET, [(a, e, self._boundary) for a, e in zip(ais, eis)])
        self._to(Phase.READY)

    def execute(self, agent_info: DictTensor | None = None) -> None:
        """Starts one acquisition on every worker and returns at once.

        Args:
            agent_info: ``None`` to keep the current one, or CPU ``n_elems()`` rows that replace it from now on
                (rows of finished envs are ignored).

        Raises:
            BatcherStateError: no ``reset`` yet, an ``execute`` already pending, or every env finished.
        """
        self._enter("execute")
        ai = self._check_rows(agent_info, "agent_info", "agent_info/") if agent_info is not None else None
        parts = self._split(ai) if ai is not None and not ai.empty() else [None] * len(self._workers)
        if parts[0] is not None and self._reset_parts is not None:
            self._reset_parts = (parts, self._reset_parts[1])  # the agent_info a restarted worker is reset with
        self._wait_for_gather()
        self._n_acquisitions += 1
        self._boundary += 1
        self._acquire_args = [(a, self._slot, self._boundary) for a in parts]
        # In process, send() runs the whole acquisition: an interrupt there leaves an env that took steps the
        # buffer never recorded, so it fails the batcher like an interrupted exchange with worker processes.
        self._busy_box[0] = True
        with self._exchange("execute"):
            self._send_all(Command.ACQUIRE, self._acquire_args)
        self._to(Phase.PENDING)

    def get(self, blocking: bool = True) -> tuple[Trajectories, int] | tuple[None, None]:
        """The trajectories of the pending ``execute``.

        Args:
            blocking: wait for them; with ``False``, return ``(None, None)`` when they are not ready yet (every
                worker is polled: one that died raises at once, even while another is busy).

        Returns:
            ``(trajectories, n_still_running)``: ``B`` trajectories (one per env running when the acquisition
            started) on ``device``, and the number of envs still running after it.

        Raises:
            BatcherStateError: nothing is pending.
            BatcherWorkerError: a worker raised, died, or did not answer within ``timeout``.
        """
        self._enter("get")
        t0 = time.perf_counter()
        with self._exchange("get"):
            # Every worker is polled (a list, not all()): a dead worker is reported even while another is busy.
            if not blocking and not all([self._polled(w) for w in self._workers]):
                return None, None
            replies = self._replies("get", Command.ACQUIRE, self._acquire_args)
        t1 = time.perf_counter()
        self._wait_s += t1 - t0
        self._worker_timings = [r["timings"] for r in replies]
        n_running = sum(r["n_running"] for r in replies)
        self._busy_box[0] = False
        self._got(n_running)
        out = self._gather(replies)
        self._gather_s += time.perf_counter() - t1
        return out, n_running

    def _polled(self, w: Any) -> bool:
        """``w.poll()``; with ``restart_workers``, a dead worker counts as answered (the wait that follows replaces
        it)."""
        try:
            return w.poll()
        except BatcherWorkerError:
            if self.restart_workers == 0:
                raise
            return True

    def _gather(self, replies: list[dict[str, Any]]) -> Trajectories:
        """The acquisition's rows, batch-major: worker 0's running rows, then worker 1's, and so on.

        With ``zero_copy`` and every env running, they are views of the buffer just written (the next acquisition
        writes into the other one); otherwise they are copied out of it, once per key, since the next ``execute``
        overwrites it."""
        T = max(r["steps"] for r in replies)
        slot = self._slot
        full = all(r["n_start"] == n for r, n in zip(replies, self._n_envs))
        parts: list[Part] = []
        if self._whole is not None and full:
            whole = self._whole[slot]
            if self._views:
                self._slot = 1 - slot
                return trajectories_from(views_of(whole, T))
            parts.append((whole, slice(None), self.n_elems()))
        else:
            for block, reply, n in zip(self._blocks[slot], replies, self._n_envs):
                if reply["n_start"] == n:
                    parts.append((block, slice(None), n))
                elif reply["n_start"] > 0:  # episodic envs that had finished before this acquisition: no row
                    rows = torch.nonzero(block["lengths"] > 0, as_tuple=False).squeeze(1)
                    parts.append((block, rows, reply["n_start"]))
        out = gather(parts, T, self.device)
        if self.n_processes > 0 and any(b["lengths"].is_cuda for b in self._blocks[slot]):
            # The copies out of GPU workers' buffers (CUDA IPC) run asynchronously on this process's stream: the
            # next acquisition must not overwrite the buffers before they are done (see _wait_for_gather).
            self._copy_done = torch.cuda.Event()
            self._copy_done.record(torch.cuda.current_stream(self.device))
        return trajectories_from(out)

    def _wait_for_gather(self) -> None:
        """Blocks until the last ``get``'s copies out of GPU workers' buffers are done (only those: the learner's
        own GPU work queued since is not waited for)."""
        if self._copy_done is not None:
            self._copy_done.synchronize()
            self._copy_done = None

    def update(self, state_dict: Any) -> None:
        """Sends weights (a CPU ``state_dict``) to every worker's ``agent.update`` (blocking).

        It is serialised once; each worker process loads it with ``map_location`` onto its own device (an
        in-process worker gets a copy on its device, without serialisation).

        Raises:
            BatcherStateError: an ``execute`` is pending.
            DeviceMismatchError: a tensor of ``state_dict`` is not on the CPU.
        """
        self._enter("update")
        check_cpu_state_dict(state_dict)
        if self.n_processes == 0:
            weights: Any = tree_copy(state_dict, self._workers[0].device)
        else:
            weights = dump_weights(state_dict)
        if self.restart_workers:
            self._weights = weights  # before the call: a worker restarted during it gets them
        self._call_all("update", Command.UPDATE, [(weights,)] * len(self._workers))

    @property
    def zero_copy(self) -> bool:
        """Whether ``get`` hands out views of a double buffer (``zero_copy=True`` where it applies) rather than
        copies."""
        return self._views

    def local_agent(self) -> Any:
        """The in-process worker's agent (``n_processes=0``), e.g. to share the learner's weights with it (see
        :class:`~rlstruct.batchers.weights.WeightSync`).

        Raises:
            BatcherStateError: the batcher has worker processes (their agents live in other processes), or it
                is closed.
        """
        if self.n_processes != 0 or not self._workers:
            raise BatcherStateError(
                f"local_agent needs an open batcher with n_processes=0, got n_processes={self.n_processes} "
                f"({'closed' if not self._workers else 'open'}); send weights with update() instead"
            )
        return self._workers[0].acq.agent

    def timings(self) -> dict[str, float]:
        """Seconds spent per phase since the last :meth:`reset_timings`, and step counts.

        ``agent_forward``, ``env_step``, ``buffer_write`` and ``copy`` (agent/env info to the buffer, and the state
        kept for ``restart_workers``) are measured in the workers and summed over them; ``wait`` is the parent's
        time blocked in ``get`` and ``gather`` its time copying the result out of the buffer. ``steps`` counts loop
        iterations, ``env_steps`` env transitions; with ``cuda_graph``, ``graph_replay`` holds the replayed steps'
        agent, env and buffer-write phases together. With an env that writes in place
        (``VecEnv.writes_in_place()``), its writes into the buffer count as ``env_step`` and ``buffer_write`` holds
        the actions' alone. On a GPU the phases are exact only with ``sync_timings=True``.
        """
        total: dict[str, float] = {p: 0.0 for p in (*PHASES, "graph_replay", "steps", "env_steps")}
        for wt in self._worker_timings:
            for k, v in wt.items():
                total[k] = total.get(k, 0.0) + v
        total["wait"] = self._wait_s
        total["gather"] = self._gather_s
        return {k: v - self._timing_base.get(k, 0.0) for k, v in total.items()}

    def worker_reports(self) -> list[dict[str, Any]]:
        """What each worker saw when it started: pid, device, its CUDA-related environment variables,
        and whether CUDA was initialised."""
        return [dict(r) for r in self._reports]

    def close(self) -> None:
        """Stops every worker and frees the buffers; idempotent.

        Every worker is asked to close its env and agent (after the acquisition it may be running: it is given
        ``min(timeout, 5)`` seconds in all, 1 s after a failure, when a worker may be hung); one still running then
        is sent SIGUSR1, which it turns into an exception so that it still closes its env and agent, and is killed
        if it does not stop soon after. Errors while closing (an env's ``close`` raising, in a worker or in
        process) are logged, not raised.
        """
        failed = self._phase is Phase.FAILED
        untrack(getattr(self, "_finalizer", None))
        if not self._closing():
            return
        errors: list[BaseException] = []
        try:
            self._wait_for_gather()  # the workers free the buffers the copies read
        except Exception as e:
            errors.append(e)
        # getattr: close() also runs from __del__ on a batcher whose constructor raised before setting timeout.
        grace = 1.0 if failed else min(getattr(self, "timeout", CLOSE_GRACE_S), CLOSE_GRACE_S)
        errors += close_workers(self._workers, grace)
        self._workers = []
        self._blocks = []
        self._whole = None
        if errors:
            log.warning("errors while closing workers: %s", errors)
