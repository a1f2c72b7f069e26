"""Replacing a batcher's failed units (worker processes, Ray actors): the budget, the seeds of a replacement and
the record of each replacement. How a unit is replaced is the batcher's own."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlstruct.errors import BatcherWorkerError

__all__ = ["RestartPolicy", "WorkerRestart", "restart_seed", "restart_seeds"]

log = logging.getLogger(__name__)


def restart_seed(seed: int, restart: int) -> int:
    """The seed of a restarted worker: drawn from its first ``seed`` and its restart count (1, 2, ...), in
    ``[0, 2**31)``, so that a run with the same seeds and the same faults restarts the same way, and no restart
    replays the episodes its predecessor played.

    >>> restart_seed(3, 1) == restart_seed(3, 1), restart_seed(3, 1) != restart_seed(3, 2)
    (True, True)
    """
    state = np.random.SeedSequence([int(seed), int(restart)]).generate_state(1, dtype=np.uint32)
    return int(state[0]) & 0x7FFFFFFF


def restart_seeds(seeds: Sequence[int] | int | None, restart: int) -> list[int] | int | None:
    """:func:`restart_seed` of each of ``seeds``, or of a batcher's one seed (``None`` stays ``None``).

    >>> restart_seeds([3, 4], 1) == [restart_seed(3, 1), restart_seed(4, 1)], restart_seeds(None, 1)
    (True, None)
    >>> restart_seeds(3, 1) == restart_seed(3, 1)
    True
    """
    if seeds is None or isinstance(seeds, int):
        return None if seeds is None else restart_seed(seeds, restart)
    return [restart_seed(s, restart) for s in seeds]


@dataclass(frozen=True)
class WorkerRestart:
    """One replacement of a failed worker (or Ray actor), in a batcher's ``restarts``.

    Attributes:
        worker_id: the worker replaced (its rows keep their place).
        cause: the first line of the failure (what it raised, how it died, or that it hung).
        acquisition: how many ``execute`` calls the batcher had started when it failed (the failed one
            included); 0 for a failure in the first ``reset`` or ``update``.
        during: the call that saw the failure: ``"get"``, ``"reset"`` or ``"update"``; ``"start"`` for a worker that
            failed before it reported ready, while the batcher started.
        seed: the env seed of the new worker: its predecessor's when ``exact``, else :func:`restart_seed` of the
            worker's first seed.
        agent_seed: the agent seed of the new worker, likewise (``None`` when the batcher has no agent seeds).
        exact: whether the new worker took its predecessor's seeds and state as of the start of the failed call, so
            that it collects the same steps as if nothing had failed; ``False`` where that cannot be (one seed per
            worker, an env without ``get_state``, a Ray actor): its envs then start new episodes.
    """

    worker_id: int
    cause: str
    acquisition: int
    during: str
    seed: int
    agent_seed: int | None
    exact: bool = False


def describe(error: BaseException) -> str:
    """The cause a :class:`WorkerRestart` records: the first line of ``error``, without the advice to close the
    batcher (a batcher that replaces the unit goes on), prefixed with the error's type unless it is a
    :class:`BatcherWorkerError` (whose message says what failed).

    >>> describe(BatcherWorkerError("worker 1 raised OSError: boom; close the batcher\\ntraceback"))
    'worker 1 raised OSError: boom'
    >>> describe(RuntimeError("the actor died"))
    'RuntimeError: the actor died'
    """
    lines = str(error).splitlines()
    first = lines[0].split("; close the batcher")[0] if lines else ""
    if isinstance(error, BatcherWorkerError):
        return first or type(error).__name__
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


class RestartPolicy:
    """How many failed units a batcher may replace, the seeds each replacement gets, and the record of them.

    Args:
        budget: how many replacements are allowed; 0 for none, -1 for no limit.
        per_unit: whether ``budget`` counts each unit's replacements on its own (a Ray actor's ``max_restarts``)
            or every unit's together (``RL_Batcher``'s ``restart_workers``).
        first_seeds: each unit's first ``(env seed, agent seed)``, the agent seed ``None`` when there is none.
        unit: how the log names a unit, e.g. ``"worker"``.

    >>> policy = RestartPolicy(1, per_unit=False, first_seeds=[(3, None), (4, None)], unit="worker")
    >>> record = policy.admit(1, RuntimeError("boom"), acquisition=2, during="get")
    >>> record.seed == restart_seed(4, 1), policy.allows(0)
    (True, False)
    """

    def __init__(self, budget: int, *, per_unit: bool, first_seeds: Sequence[tuple[int, int | None]], unit: str):
        self.budget = budget
        self.per_unit = per_unit
        self.first_seeds = list(first_seeds)
        self.unit = unit
        self.records: list[WorkerRestart] = []

    def count(self, k: int) -> int:
        """How many times unit ``k`` has been replaced."""
        return sum(r.worker_id == k for r in self.records)

    def allows(self, k: int) -> bool:
        """Whether unit ``k`` may be replaced once more."""
        if self.budget == -1:
            return True
        used = self.count(k) if self.per_unit else len(self.records)
        return used < self.budget

    def admit(self, k: int, error: BaseException, acquisition: int, during: str, *,
              keep: tuple[int, int | None] | None = None) -> WorkerRestart:
        """Records and logs the replacement of unit ``k``, which failed with ``error`` during ``during()`` of
        ``execute`` number ``acquisition``; returns the record, whose seeds the replacement takes: ``keep``, the
        failed unit's ``(env seed, agent seed)``, for an exact replacement, else :func:`restart_seed` ones.

        It is counted before the replacement starts: one that fails while starting uses the budget too, so that a
        unit that can never be rebuilt exhausts it instead of being retried forever.
        """
        n = self.count(k) + 1
        if keep is not None:
            record = WorkerRestart(k, describe(error), acquisition, during, keep[0], keep[1], exact=True)
            how = "exact: the same seeds and state, the same steps"
        else:
            seed, agent_seed = self.first_seeds[k]
            record = WorkerRestart(k, describe(error), acquisition, during, restart_seed(seed, n),
                                   None if agent_seed is None else restart_seed(agent_seed, n))
            how = f"not exact: seed {record.seed}, its envs start new episodes"
        self.records.append(record)
        used = n if self.per_unit else len(self.records)
        when = "while the batcher started" if during == "start" else f"during {during}() of acquisition {acquisition}"
        log.warning("%s %d failed %s (%s); replacing it (restart %d of %s, %s)", self.unit, k, when, record.cause,
                    used, "unlimited" if self.budget == -1 else self.budget, how)
        return record
