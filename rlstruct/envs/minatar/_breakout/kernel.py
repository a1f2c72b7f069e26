"""MinAtar Breakout for one env at a time (numba): :mod:`.rules`'s rules over row ``i`` of the state arrays, for
the compiled CPU step (:mod:`rlstruct.envs.minatar._jit_driver`); the same bits as :data:`.rules.GAME`.

>>> import numpy as np, torch
>>> from rlstruct.envs.minatar._breakout.rules import GAME
>>> state = GAME.reset(torch.tensor([[0.2], [0.7]], dtype=torch.float64), True)
>>> s = tuple(state[k].numpy() for k in STATE_KEYS)
>>> step(s, 0, 3, np.zeros(0), True), state["ball_x"].tolist(), state["pos"].tolist()
((0.0, False), [1, 9], [5, 4])
"""

from __future__ import annotations

import numpy as np

from rlstruct.envs._jit_kernels import jit

__all__ = ["STATE_KEYS", "reset", "step", "observe"]

_jit = jit

STATE_KEYS = ("ball_x", "ball_y", "ball_dir", "pos", "last_x", "last_y", "strike", "bricks")
# The state's arrays are read through the tuple ``s`` by these constant indices, never bound to names: numba
# then counts no references to them (which would cost more than the game's rules).
_BALL_X = 0
_BALL_Y = 1
_BALL_DIR = 2
_POS = 3
_LAST_X = 4
_LAST_Y = 5
_STRIKE = 6
_BRICKS = 7


@_jit
def reset(s, i, u, ramping):
    """Row ``i`` of the state ``s`` (:data:`STATE_KEYS`' arrays): a new game from the draw ``u[0]``."""
    right = np.int64(np.floor(u[0] * 2.0)) == 1
    x = 9 if right else 0
    s[_BALL_X][i] = x
    s[_BALL_Y][i] = 3
    s[_BALL_DIR][i] = 3 if right else 2
    s[_POS][i] = 4
    s[_LAST_X][i] = x
    s[_LAST_Y][i] = 3
    s[_STRIKE][i] = False
    for y in range(10):
        for c in range(10):
            s[_BRICKS][i, y, c] = 1 <= y <= 3


@_jit
def step(s, i, action, u, ramping):
    """Row ``i`` of ``s`` after the full-set action ``action``: ``(reward, terminated)``."""
    p = s[_POS][i]
    if action == 1:
        p = max(p - 1, 0)
    elif action == 3:
        p = min(p + 1, 9)
    x, y, d = s[_BALL_X][i], s[_BALL_Y][i], s[_BALL_DIR][i]
    nx = x + (1 if d == 1 or d == 2 else -1)
    ny = y + (-1 if d <= 1 else 1)
    if nx < 0 or nx > 9:
        nx = min(max(nx, 0), 9)
        d = d ^ 1
    top = ny < 0
    if top:
        ny = 0
        d = 3 - d
    brick = not top and s[_BRICKS][i, ny, nx]
    broken = brick and not s[_STRIKE][i]
    if broken:
        s[_BRICKS][i, ny, nx] = False
        ny = y
        d = 3 - d
    terminated = False
    if not top and not brick and ny == 9:
        if not s[_BRICKS][i].any():
            for row in range(1, 4):
                for c in range(10):
                    s[_BRICKS][i, row, c] = True
        if x == p:
            d = 3 - d
            ny = y
        elif nx == p:
            d = d ^ 2
            ny = y
        else:
            terminated = True
    s[_BALL_X][i] = nx
    s[_BALL_Y][i] = ny
    s[_BALL_DIR][i] = d
    s[_POS][i] = p
    s[_LAST_X][i] = x
    s[_LAST_Y][i] = y
    s[_STRIKE][i] = brick
    return 1.0 if broken else 0.0, terminated


@_jit
def observe(s, i, frame):
    """Row ``i``'s frame into ``frame`` (``bool [10, 10, 4]``), cleared first."""
    frame[:] = False
    frame[9, s[_POS][i], 0] = True
    frame[s[_BALL_Y][i], s[_BALL_X][i], 1] = True
    frame[s[_LAST_Y][i], s[_LAST_X][i], 2] = True
    for y in range(10):
        for c in range(10):
            frame[y, c, 3] = s[_BRICKS][i, y, c]
