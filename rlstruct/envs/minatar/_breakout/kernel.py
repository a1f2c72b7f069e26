"""MinAtar Breakout for one env at a time (numba): :mod:`.rules`' functions compiled by
:func:`rlstruct.envs.minatar._scalar.kernels`, for the compiled CPU step (:mod:`rlstruct.envs.minatar._jit_driver`).

>>> import numpy as np, torch
>>> from rlstruct.envs.minatar._breakout.rules import GAME
>>> state = GAME.reset(torch.tensor([[0.2], [0.7]], dtype=torch.float64), True)
>>> s = tuple(state[k].numpy() for k in STATE_KEYS)
>>> step(s, 0, 3, np.zeros(0), True), state["ball_x"].tolist(), state["pos"].tolist()
((0.0, False), [1, 9], [5, 4])
"""

from __future__ import annotations

from rlstruct.envs.minatar._breakout import rules
from rlstruct.envs.minatar._scalar import kernels

__all__ = ["STATE_KEYS", "reset", "step", "observe"]

_game = kernels(rules)
STATE_KEYS, reset, step, observe = _game.STATE_KEYS, _game.reset, _game.step, _game.observe
