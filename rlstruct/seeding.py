"""The one seed checker every rlstruct entry point uses.

A seed is an int in ``[0, 2**31)``: non-negative as gymnasium requires, and small enough for the C ``int`` that
native simulators (ale-py, EnvPool) take, so a seed accepted here is accepted by every backend.
"""

from __future__ import annotations

import operator
from typing import Any

from rlstruct.errors import SeedError

__all__ = ["MAX_SEED", "check_seed"]

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
