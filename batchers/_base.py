"""The base class of every batcher: the call-order state machine and the handling of ``agent_info``/``env_info``
rows (checked against the buffer's layout, split over the units, repeated from the constructor's example)."""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from rlstruct.batchers._args import BatcherArgs, check_cpu
from rlstruct.batchers._buffer import Specs
from rlstruct.batchers._restart import RestartPolicy, WorkerRestart
from rlstruct.errors import BatcherStateError, BatcherWorkerError, BatchSizeError
from rlstruct.structures import DictTensor

__all__ = ["BatcherBase", "Phase", "repeat_first", "same_specs"]

_B = TypeVar("_B", bound="BatcherBase")


def repeat_first(d: DictTensor, n: int) -> DictTensor:
    """``n`` copies of the first row of ``d`` (``d`` itself when empty)."""
    if d.empty():
        return d
    return DictTensor._trusted({k: v[:1].expand((n,) + v.shape[1:]).clone() for k, v in d.items()})


def same_specs(specs: list[Specs], unit: str) -> Specs:
    """The buffer layout every unit (``"worker"``, ``"actor"``) reported, or BatcherWorkerError naming the first
    unit whose keys, shapes or dtypes differ from unit 0's."""
    for k, s in enumerate(specs[1:], 1):
        if s != specs[0]:
            diff = sorted(set(s.items()) ^ set(specs[0].items()), key=str)
            raise BatcherWorkerError(
                f"{unit} {k} produces other keys, shapes or dtypes than {unit} 0: {diff}; every {unit} must build "
                "the same kind of env and agent",
                worker_id=k,
            )
    return specs[0]


class Phase(enum.Enum):
    """Where a batcher is in its call order: ``reset`` -> ``execute`` -> ``get`` -> ``execute`` ..."""

    NEW = "new"  # built: reset() comes first
    READY = "ready"  # an execute() may start
    PENDING = "pending"  # an execute() awaits its get()
    FINISHED = "finished"  # every env finished its episode: reset() comes next
    FAILED = "failed"  # a worker or actor failed: only close() is left
    CLOSED = "closed"


class BatcherBase:
    """The call-order state machine and the row handling of a batcher whose envs are split over units (workers,
    actors).

    A subclass sets ``_name`` (its class name in messages), ``_unit`` (``"a worker"`` or ``"an actor"``) and
    ``_rows`` (how the number of envs is computed, for messages), keeps its checked arguments with :meth:`_keep`,
    and sets ``_specs``, ``_n_envs``, ``_offsets`` and ``_restart_policy``. Its public methods call
    ``_enter(method)`` first, and move the state with ``_to`` (and ``_fail`` when a unit failed).
    """

    _name: str
    _unit: str
    _rows: str
    _phase: Phase = Phase.NEW
    _failure = ""  # why the batcher failed (the first line of the error), in later messages
    _specs: Specs
    _n_envs: list[int]
    _offsets: list[int]
    _default_agent_info: DictTensor
    _default_env_info: DictTensor
    _timing_base: dict[str, float]
    _restart_policy: RestartPolicy

    def _keep(self, args: BatcherArgs) -> None:
        """Keeps what every batcher reads of its checked arguments, and starts its counters."""
        self.n_timesteps = args.n_timesteps
        self.n_processes = args.n_processes
        self.device = args.device
        self.timeout = args.timeout
        self.restart_workers = args.restart_workers
        self._default_agent_info = args.agent_info
        self._default_env_info = args.env_info
        self._n_acquisitions = 0
        self._wait_s = 0.0
        self._gather_s = 0.0
        self._timing_base = {}

    def n_elems(self) -> int:
        """The total number of envs, summed over the units (worker processes, actors)."""
        return sum(self._n_envs)

    @property
    def restarts(self) -> list[WorkerRestart]:
        """Every replacement of a failed unit (a worker process; a RayBatcher's actor), in order."""
        return self._restart_policy.records

    @property
    def n_restarts(self) -> int:
        """How many failed units have been replaced (see :attr:`restarts`)."""
        return len(self.restarts)

    # ----------------------------------------------------------------- the state machine
    def _enter(self, method: str) -> None:
        """Raises BatcherStateError unless ``method`` (``"reset"``, ``"update"``, ``"execute"``, ``"get"``) may run
        now."""
        phase = self._phase
        if phase is Phase.CLOSED:
            raise BatcherStateError(f"{method}() called after close(); build a new {self._name}")
        if phase is Phase.FAILED:
            raise BatcherStateError(
                f"{method}() called after {self._failure}; the batcher failed: close() it and build a new one"
            )
        if method == "get":
            if phase is not Phase.PENDING:
                raise BatcherStateError("get() called with no execute() pending; call execute() first")
        elif method == "execute":
            if phase is Phase.NEW:
                raise BatcherStateError("execute() called before reset(); call reset() first")
            if phase is Phase.PENDING:
                raise BatcherStateError("execute() called while another execute() is pending; call get() first")
            if phase is Phase.FINISHED:
                raise BatcherStateError(
                    "execute() called but every env has finished its episode; call reset() to start new ones"
                )
        elif phase is Phase.PENDING:
            raise BatcherStateError(f"{method}() called while an execute() is pending; call get() first")

    def _to(self, phase: Phase) -> None:
        self._phase = phase

    def _got(self, n_running: int) -> None:
        """The move after a ``get`` that left ``n_running`` envs running."""
        self._phase = Phase.READY if n_running > 0 else Phase.FINISHED

    def _fail(self, e: BaseException, method: str = "") -> None:
        """Moves to FAILED because of ``e``, raised in ``method`` while talking to the units; later calls say why."""
        lines = str(e).splitlines()
        first = lines[0] if lines else ""
        if isinstance(e, Exception):
            self._failure = f"{self._unit} failed ({first or type(e).__name__})"
        else:
            # An interrupt (Ctrl-C, SystemExit) between a request and its replies leaves replies unread: the next
            # call would read the previous one's. Nothing can tell them apart, so the batcher is spent.
            self._failure = (
                f"{method or 'a call'}() was interrupted by {type(e).__name__}{': ' + first if first else ''} "
                "while it talked to the workers (their replies are out of step)"
            )
        self._phase = Phase.FAILED

    @contextmanager
    def _exchange(self, method: str) -> Iterator[None]:
        """Wraps a request to the units and the wait for their replies (or an in-process acquisition): whatever
        escapes it, a unit's failure or an interrupt, moves the batcher to FAILED and is re-raised unchanged."""
        try:
            yield
        except BaseException as e:
            self._fail(e, method)
            raise

    def _busy(self) -> bool:
        """Whether a unit may be busy (an acquisition pending) or hung (failed): ``close`` waits less for it."""
        return self._phase in (Phase.PENDING, Phase.FAILED)

    def _closing(self) -> bool:
        """Moves to CLOSED; ``False`` when it was closed already (``close`` is idempotent)."""
        if self._phase is Phase.CLOSED:
            return False
        self._phase = Phase.CLOSED
        return True

    def _check_rows(self, d: DictTensor, name: str, prefix: str) -> DictTensor:
        d = check_cpu(d, name)
        if d.empty():
            return d
        n = self.n_elems()
        if d.n_elems() != n:
            raise BatchSizeError(
                f"{name} must have one row per env, {self._rows} = {n}, got {d.n_elems()}; "
                "or pass an empty DictTensor"
            )
        expected = {k[len(prefix):]: v for k, v in self._specs.items() if k.startswith(prefix)}
        got = {k: (tuple(v.shape[1:]), v.dtype) for k, v in d.items()}
        if got != expected:
            raise ValueError(
                f"{name} must have the keys, row shapes and dtypes of the example given to {self._name}, "
                f"{expected}, got {got}; pass the same kind of {name} as at construction"
            )
        return d

    def _reset_rows(
        self, agent_info: DictTensor | None, env_info: DictTensor | None
    ) -> tuple[DictTensor, DictTensor]:
        """``reset``'s checked ``agent_info`` and ``env_info``, the constructor examples' first rows by default."""
        ai = self._check_rows(agent_info, "agent_info", "agent_info/") if agent_info is not None else DictTensor({})
        ei = self._check_rows(env_info, "env_info", "env_info/") if env_info is not None else DictTensor({})
        if ai.empty():
            ai = repeat_first(self._default_agent_info, self.n_elems())
        if ei.empty():
            ei = repeat_first(self._default_env_info, self.n_elems())
        return ai, ei

    def _split(self, d: DictTensor) -> list[DictTensor]:
        return [d.slice(o, o + n) for o, n in zip(self._offsets, self._n_envs)]

    def timings(self) -> dict[str, float]:
        raise NotImplementedError

    def reset_timings(self) -> None:
        """Restarts the :meth:`timings` counters from zero."""
        self._timing_base = {}
        self._timing_base = self.timings()

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _B) -> _B:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
