"""How RL_Batcher replaces a failed worker (``restart_workers``): the waits that find the failure, the replacement,
and the state each worker carries from one call to the next, kept in memory the batcher owns so that a replacement
restores it and collects the failed acquisition again exactly (see :mod:`~rlstruct.batchers._carry`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from rlstruct.batchers._base import repeat_first
from rlstruct.batchers._carry import allocate_carry, holds
from rlstruct.batchers._parent import close_workers, recv_all, recv_each
from rlstruct.batchers._protocol import Command, WorkerSpec
from rlstruct.batchers._restart import RestartPolicy
from rlstruct.devices import tree_copy
from rlstruct.errors import BatcherWorkerError, BatcherWorkerTimeout

__all__ = ["ABANDON_GRACE_S", "CLOSE_GRACE_S", "WorkerReplacement"]

log = logging.getLogger(__name__)

# Seconds close() gives the workers to finish a pending acquisition and close their envs and agents.
CLOSE_GRACE_S = 5.0
# The same for a worker busy with an acquisition nobody will read (the batcher was garbage-collected or the
# interpreter exits with an execute() pending) or a failed worker being replaced: a program's exit must not wait
# on a long or hung acquisition. The stop signal then makes the worker close its env and agent.
ABANDON_GRACE_S = 1.0


class _RestartsExhausted(Exception):
    """Carries the error that ends a batcher out of its restart loop, past the handler of restart failures."""

    def __init__(self, error: BatcherWorkerError, cause: BatcherWorkerError):
        super().__init__(str(error))
        self.error, self.cause = error, cause


class WorkerReplacement:
    """RL_Batcher's replacement of failed workers.

    Each reset and each acquisition is a boundary, numbered by ``_boundary`` and sent with the call; with
    ``restart_workers`` and one seed, every worker whose env has a ``get_state`` keeps its state at the end of each
    call in ``_carries[k]`` (two slots this process allocated). A worker that fails is replaced by one built with the
    same seeds, which restores the state of the boundary before the failed call and makes that call again: the same
    steps, bit for bit. Otherwise (one seed per worker, an env without state, no kept boundary, or a failure that
    repeats in an exact replacement) the replacement gets :func:`~rlstruct.batchers.restart_seed` seeds and a reset.
    """

    _workers: list
    _worker_specs: list[WorkerSpec]
    _Worker: Any
    _restart_policy: RestartPolicy
    _n_envs: list[int]
    _specs: Any
    _blocks: list
    _whole: Any
    _weights: Any
    _reset_parts: tuple[list, list] | None
    _reports: list
    _start_timeout: float
    _default_agent_info: Any
    _default_env_info: Any
    _n_acquisitions: int
    _boundary: int
    timeout: float
    restart_workers: int
    n_processes: int

    def _start_workers(self) -> list[dict[str, Any]]:
        """Starts every worker (``_worker_specs``) and returns their first replies (``n_envs``, ``report``).

        With ``restart_workers``, a worker that fails before it reports ready (it raised while building its env or
        agent, died, or did not answer within ``start_timeout``) is replaced as one failing later is: the restart is
        counted (``during="start"``) and logged, and the failure after the last allowed one raises. Nothing has been
        collected yet, so the first replacement takes the same seeds (``exact``); one that fails at its start again
        gets :func:`~rlstruct.batchers.restart_seed` seeds, as a seed that cannot be built would fail the same way.
        """
        for spec in self._worker_specs:
            try:
                self._workers.append(self._Worker(spec, self.timeout))
            except BatcherWorkerError as e:  # an in-process worker builds its env and agent here
                if self.restart_workers == 0:
                    raise
                self._workers.append(e)
        if self.restart_workers == 0:
            return recv_all(self._workers, self._start_timeout, "start_timeout")
        try:
            started = [k for k, w in enumerate(self._workers) if not isinstance(w, BatcherWorkerError)]
            ready: list[Any] = list(self._workers)
            for k, r in zip(started, recv_each([self._workers[k] for k in started], self._start_timeout,
                                               "start_timeout")):
                ready[k] = r
            for k, r in enumerate(ready):
                while isinstance(r, BatcherWorkerError):
                    r = self._start_again(k, r)
                ready[k] = r
            return ready
        finally:
            # A worker that failed to start holds its place by its error until it is replaced: none is left to close.
            self._workers[:] = [w for w in self._workers if not isinstance(w, BatcherWorkerError)]

    def _start_again(self, k: int, cause: BatcherWorkerError) -> Any:
        """Replaces worker ``k``, which failed with ``cause`` before it reported ready, by a new one; returns the new
        one's first reply, or the :class:`BatcherWorkerError` of its own failure to start. Raises when no restart is
        left."""
        policy = self._restart_policy
        if not policy.allows(k):
            raise self._spent(cause) from cause
        spec = self._worker_specs[k]
        again = any(r.worker_id == k and r.during == "start" for r in policy.records)
        record = policy.admit(k, cause, 0, "start", keep=None if again else (spec.seed, spec.agent_seed))
        failed = self._workers[k]
        if not isinstance(failed, BatcherWorkerError):
            grace = ABANDON_GRACE_S if isinstance(cause, BatcherWorkerTimeout) else CLOSE_GRACE_S
            errors = close_workers([failed], grace)
            if errors:
                log.debug("closing failed worker %d: %s", k, errors)
        self._workers[k] = cause
        spec = self._worker_specs[k] = replace(spec, seed=record.seed, agent_seed=record.agent_seed)
        try:
            w = self._workers[k] = self._Worker(spec, self.timeout)
            return self._recv(w)
        except BatcherWorkerError as e:
            return e

    def _spent(self, cause: BatcherWorkerError) -> BatcherWorkerError:
        """The error that ends the batcher when ``cause`` finds every allowed restart used."""
        return BatcherWorkerError(
            f"{cause}\n(restart_workers={self.restart_workers}: every allowed restart has been used: "
            f"{[(r.worker_id, r.cause) for r in self._restart_policy.records]})",
            worker_id=cause.worker_id, remote_traceback=cause.remote_traceback,
        )

    def _start_carries(self, one_seed: bool) -> None:
        """Allocates each worker's kept state, where it can be kept (``restart_workers`` and one seed)."""
        self._carries: list[list[dict[str, torch.Tensor]] | None] = [None] * len(self._workers)
        self._carry_layouts: list[Any] = [None] * len(self._workers)
        if not (self.restart_workers and one_seed):
            return
        self._carry_layouts = self._ask_all(Command.CARRY, None)
        for k, layout in enumerate(self._carry_layouts):
            if layout is not None:
                self._carries[k] = allocate_carry(layout, self._n_envs[k], shared=self.n_processes > 0)
        for w, slots in zip(self._workers, self._carries):
            w.send(Command.CARRY, slots)
        recv_all(self._workers, self._start_timeout, "start_timeout")

    def _ask_all(self, command: Command, *args: Any) -> list[Any]:
        for w in self._workers:
            w.send(command, *args)
        return recv_all(self._workers, self._start_timeout, "start_timeout")

    def _replies(self, method: str, command: Command, args_per_worker: Sequence[tuple]) -> list[Any]:
        """Every worker's reply to ``command`` (sent already). Without ``restart_workers`` the first failure
        raises; with it, a failed worker is replaced (:meth:`_restart`) and sent ``command`` again, until it
        answers or no restart is left."""
        if self.restart_workers == 0:
            return recv_all(self._workers, self.timeout)
        replies = recv_each(self._workers, self.timeout)
        for k, r in enumerate(replies):
            while isinstance(r, BatcherWorkerError):
                try:
                    self._restart(k, r, method)
                    # A restarted worker has the last weights and its state (restored, or a reset): only an
                    # acquisition is asked again.
                    if command is Command.ACQUIRE:
                        w = self._workers[k]
                        w.send(command, *args_per_worker[k])
                        r = w.recv()
                    else:
                        r = None
                except _RestartsExhausted as e:
                    raise e.error from e.cause
                except BatcherWorkerError as e:  # the new worker failed too (while starting): one more restart
                    r = e
            replies[k] = r
        return replies

    def _exact_boundary(self, k: int, method: str) -> int | None:
        """The boundary whose state worker ``k``'s replacement restores (0: the state a new worker starts in), or
        ``None`` when the replacement cannot be exact."""
        slots = self._carries[k]
        if slots is None:
            return None
        n = self._n_acquisitions
        if any(r.worker_id == k and r.exact and (r.acquisition, r.during) == (n, method)
               for r in self._restart_policy.records):
            return None  # it failed again where an exact replacement started: the same steps would fail the same way
        want = self._boundary - (method != "update")  # the state before the failed call
        return want if want == 0 or holds(slots, want) else None

    def _restart(self, k: int, cause: BatcherWorkerError, method: str) -> None:
        """Replaces worker ``k``, which failed with ``cause`` during ``method``, by a fresh one, ready for the
        batcher's next call: built from the same arguments, bound to the same rows of the buffer, given the last
        weights; then, where it can be exact, with the same seeds and the state kept before the failed call, else with
        :func:`~rlstruct.batchers.restart_seed` seeds and (once the batcher has been reset) a reset with its rows of
        the last ``env_info`` and latest ``agent_info``. Raises ``cause`` when no restart is left."""
        policy = self._restart_policy
        if not policy.allows(k):
            raise _RestartsExhausted(self._spent(cause), cause)
        boundary = self._exact_boundary(k, method)
        spec = self._worker_specs[k]
        record = policy.admit(k, cause, self._n_acquisitions, method,
                              keep=None if boundary is None else (spec.seed, spec.agent_seed))
        spec = replace(spec, seed=record.seed, agent_seed=record.agent_seed)
        # A hung worker is stopped soon, then killed; one that raised closes its env and agent as at close().
        grace = ABANDON_GRACE_S if isinstance(cause, BatcherWorkerTimeout) else CLOSE_GRACE_S
        errors = close_workers([self._workers[k]], grace)
        if errors:
            log.debug("closing failed worker %d: %s", k, errors)
        # A BatcherWorkerError from here on (the new worker died or raised while starting) is one more failure of
        # worker k: _replies restarts it again while restarts are left.
        w = self._workers[k] = self._Worker(spec, self.timeout)
        self._worker_specs[k] = spec
        ready = self._recv(w)
        if ready["n_envs"] != self._n_envs[k]:
            raise BatcherWorkerError(
                f"restarted worker {k} built {ready['n_envs']} envs, its predecessor {self._n_envs[k]}; create_env "
                "must build as many envs whatever the seed", worker_id=k,
            )
        n_envs = self._n_envs[k]
        w.send(Command.PROBE, repeat_first(self._default_agent_info, n_envs),
               repeat_first(self._default_env_info, n_envs))
        if self._recv(w) != self._specs:
            raise BatcherWorkerError(
                f"restarted worker {k} produces other keys, shapes or dtypes than before; every worker must build the "
                "same kind of env and agent whatever its seed", worker_id=k,
            )
        self._rebind(k, w)
        if self._weights is not None:
            weights = self._weights if self.n_processes else tree_copy(self._weights, w.device)
            w.send(Command.UPDATE, weights)
            w.recv()
        if self._reset_parts is not None:
            ais, eis = self._reset_parts
            if boundary:
                w.send(Command.RESTORE, ais[k], eis[k], boundary)
                w.recv()
            if not boundary or method == "reset":
                # The reset of a failed reset() is that call's boundary; one before an acquisition, the boundary
                # before it.
                w.send(Command.RESET, ais[k], eis[k], self._boundary - (method == "get"))
                w.recv()
        self._reports[k] = ready["report"]

    def _recv(self, w: Any) -> Any:
        return w.recv(self._start_timeout, "start_timeout")

    def _rebind(self, k: int, w: Any) -> None:
        """Gives replacement ``w`` worker ``k``'s rows of the buffer and its kept state."""
        if self._whole is not None:
            w.send(Command.BIND, [blocks[k] for blocks in self._blocks])
        elif w.device.type == "cuda":
            w.send(Command.BIND, None)
        else:
            w.send(Command.BIND, [self._blocks[0][k]])
        got = self._recv(w)
        if self._whole is None and w.device.type == "cuda":
            self._blocks[0][k] = got
        if self._carries[k] is not None:
            w.send(Command.CARRY, None)
            if self._recv(w) != self._carry_layouts[k]:
                raise BatcherWorkerError(
                    f"restarted worker {k}'s env or agent state has another layout than its predecessor's; every "
                    "worker must build the same kind of env and agent whatever its seed", worker_id=k,
                )
            w.send(Command.CARRY, self._carries[k])
            self._recv(w)
