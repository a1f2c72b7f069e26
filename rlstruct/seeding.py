"""The one seed checker every rlstruct entry point uses.

A seed is an int in ``[0, 2**31)``: non-negative as gymnasium requires, and small enough for the C ``int`` that
native simulators (ale-py, EnvPool) take, so a seed accepted here is accepted by every backend. Every seed
rlstruct derives for an env (:func:`env_seeds`) lies in the same range, for the same reason.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from rlstruct.errors import SeedError

__all__ = ["MAX_SEED", "check_env_index", "check_seed", "env_seeds"]

MAX_SEED = 2**31 - 1
"""The largest seed rlstruct accepts (a C ``int``)."""


def check_seed(seed: Any, *, argument: str = "seed") -> int:
    """``seed`` as a Python int, checked.

    Args:
        seed: the value to check (an int, a numpy integer, a 0-d integer tensor: anything with ``__index__``).
        argument: the argument's name, for the message.

    Returns:
        ``int(seed)``.

    Raises:
        SeedError: ``seed`` is not an integer, or outside ``[0, 2**31)``.

    >>> check_seed(7)
    7
    >>> check_seed(-1)
    Traceback (most recent call last):
    ...
    rlstruct.errors.SeedError: seed must be an int in [0, 2**31), got -1; pass a non-negative int below 2147483648
    """
    if isinstance(seed, bool):
        raise SeedError(f"{argument} must be an int in [0, 2**31), got the bool {seed!r}; pass e.g. {argument}=0")
    try:
        s = operator.index(seed)
    except TypeError:
        raise SeedError(
            f"{argument} must be an int in [0, 2**31), got {type(seed).__name__} {seed!r}; pass e.g. {argument}=0"
        ) from None
    if not 0 <= s <= MAX_SEED:
        raise SeedError(
            f"{argument} must be an int in [0, 2**31), got {s}; pass a non-negative int below {MAX_SEED + 1}"
        )
    return s


def check_env_index(env_index: Any, *, argument: str = "env_index") -> int:
    """``env_index`` (the global index of a VecEnv's first env) as a Python int, checked to be ``>= 0``.

    Raises:
        ValueError: ``env_index`` is not an int ``>= 0``.

    >>> check_env_index(8)
    8
    """
    if isinstance(env_index, bool) or not isinstance(env_index, (int, np.integer)) or env_index < 0:
        raise ValueError(f"{argument} must be an int >= 0 (the global index of the first env), got {env_index!r}; "
                         f"pass e.g. {argument}=0")
    return int(env_index)


def env_seeds(seed: int, n_envs: int, first: int = 0) -> list[int]:
    """The reset seed of each of ``n_envs`` envs built with ``seed``, each in ``[0, 2**31)``.

    Seed ``k`` is ``numpy.random.SeedSequence(seed).spawn(n_envs)[k]`` drawn as a 32-bit int with its top bit
    cleared (so that a C ``int`` holds it): distinct across ``k`` and unrelated between consecutive ``seed``
    values (``seed + k`` would give worker ``w``'s env 1 the seed of worker ``w + 1``'s env 0).

    Args:
        seed: an int in ``[0, 2**31)``.
        n_envs: the number of envs.
        first: the global index of the first env: envs ``first, ..., first + n_envs - 1`` of ``seed``, so that
            envs split over processes are seeded as the same envs in one process.

    Returns:
        ``n_envs`` ints in ``[0, 2**31)``; seed ``k`` depends on ``(seed, first + k)`` only.

    Raises:
        SeedError: ``seed`` is not an int in ``[0, 2**31)``.

    >>> env_seeds(0, 3) == env_seeds(0, 3), env_seeds(0, 3)[:2] == env_seeds(0, 2)
    (True, True)
    >>> env_seeds(0, 2, first=1) == env_seeds(0, 3)[1:]
    True
    >>> set(env_seeds(0, 3)) & set(env_seeds(1, 3)), max(env_seeds(0, 100)) <= MAX_SEED
    (set(), True)
    """
    seed = check_seed(seed)
    # SeedSequence(seed).spawn(n)[k] is SeedSequence(seed, spawn_key=(k,)): built directly, it needs no spawning of
    # the first ``first`` children.
    children = (np.random.SeedSequence(seed, spawn_key=(k,)) for k in range(first, first + n_envs))
    return [int(s.generate_state(1, np.uint32)[0]) & MAX_SEED for s in children]
