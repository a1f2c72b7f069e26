"""MinAtar Freeway for one env at a time (numba): :mod:`.rules`' functions compiled by
:func:`rlstruct.envs.minatar._scalar.kernels`, for the compiled CPU step (:mod:`rlstruct.envs.minatar._jit_driver`)."""

from __future__ import annotations

from rlstruct.envs.minatar._freeway import rules
from rlstruct.envs.minatar._scalar import kernels

__all__ = ["STATE_KEYS", "reset", "step", "observe"]

_game = kernels(rules)
STATE_KEYS, reset, step, observe = _game.STATE_KEYS, _game.reset, _game.step, _game.observe
