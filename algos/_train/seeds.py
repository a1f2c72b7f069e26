"""The seeds of a run's batchers and sessions: a training batcher takes one seed per role (:func:`role_seed`: its
envs are seeded by their global index, whatever process steps them), the evaluation's, ``rlstruct eval``'s and
``rlstruct profile``'s batchers one per worker (:func:`worker_seeds`); a resumed session takes :func:`session_seed`."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from rlstruct.errors import ConfigError
from rlstruct.seeding import check_seed

__all__ = [
    "AGENT_SEEDS",
    "ENV_SEEDS",
    "EVALUATION_AGENT_SEEDS",
    "EVALUATION_ENV_SEEDS",
    "MAX_WORKERS",
    "check_seeds",
    "evaluation_seeds",
    "role_seed",
    "session_seed",
    "worker_seeds",
]

#: the seed offsets of the batchers' roles: training envs and agents, evaluation envs and agents
ENV_SEEDS = 0
EVALUATION_ENV_SEEDS = 1000
AGENT_SEEDS = 5000
EVALUATION_AGENT_SEEDS = 6000
#: the workers a batcher role with one seed per worker may have: the distance between two roles' seed offsets
MAX_WORKERS = 1000


def worker_seeds(seed: int, n_workers: int, offset: int) -> list[int]:
    """Distinct env/agent seeds per worker, per batcher (``offset`` tells batchers apart), in ``[0, 2**31)``.

    >>> worker_seeds(3, 2, 1000), worker_seeds(2**31 - 1, 1, 0)
    ([31000, 31001], [2147473648])
    """
    return [(seed * 10_000 + offset + k) % 2**31 for k in range(n_workers)]


def evaluation_seeds(seed: int, n_workers: int) -> tuple[list[int], list[int]]:
    """The env seeds and agent seeds, one per worker, of an evaluation batcher from ``seed``: a training run's
    evaluation, ``rlstruct eval``'s and the datasets ``rlstruct record`` writes of a run, which so play the same
    episodes.

    >>> evaluation_seeds(3, 2)
    ([31000, 31001], [36000, 36001])
    """
    return worker_seeds(seed, n_workers, EVALUATION_ENV_SEEDS), worker_seeds(seed, n_workers, EVALUATION_AGENT_SEEDS)


def role_seed(seed: int, offset: int) -> int:
    """The one seed of a batcher role (``offset``) whose envs are seeded by their global index: the first of
    :func:`worker_seeds`, so that a run in one process keeps the env seed it had with one seed per worker.

    >>> role_seed(3, AGENT_SEEDS) == worker_seeds(3, 1, AGENT_SEEDS)[0]
    True
    """
    return worker_seeds(seed, 1, offset)[0]


def session_seed(seed: int, iteration: int) -> int:
    """The seed of a training session's envs, agents and learner generators: ``seed`` for a fresh run
    (``iteration`` 0), else a hash of ``(seed, iteration)`` in ``[0, 214,748)`` (where :func:`worker_seeds` does not
    wrap), so that a run resumed at ``iteration`` does not replay the episodes and samples of its first session.

    >>> session_seed(7, 0), session_seed(7, 120) == session_seed(7, 120), session_seed(7, 120) != session_seed(7, 121)
    (7, True, True)
    """
    if iteration == 0:
        return seed
    digest = hashlib.sha256(f"rlstruct-resume/{seed}/{iteration}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % 214_748


def check_seeds(seeds: Any, *, argument: str = "seeds") -> tuple[int, ...]:
    """``seeds`` as a tuple of two or more distinct seeds, each an int in ``[0, 2**31)``.

    Raises:
        ConfigError: not a sequence of ints, fewer than two, or one repeated.
        SeedError: a seed out of range.

    >>> check_seeds([0, 1, 2])
    (0, 1, 2)
    >>> check_seeds([1, 1])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rlstruct.errors.ConfigError: seeds must be two or more distinct seeds, got [1, 1] (1 repeated); pass e.g. ...
    """
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence):
        raise ConfigError(f"{argument} must be a list of seeds, got {seeds!r}; pass e.g. --seeds 0,1,2,3,4")
    seeds = [check_seed(s, argument=f"{argument}[{i}]") for i, s in enumerate(seeds)]
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if len(seeds) < 2 or repeated:
        why = f" ({', '.join(map(str, repeated))} repeated)" if repeated else ""
        raise ConfigError(f"{argument} must be two or more distinct seeds, got {seeds}{why}; pass e.g. --seeds "
                          "0,1,2,3,4 (one seed: --seed S)")
    return tuple(seeds)
