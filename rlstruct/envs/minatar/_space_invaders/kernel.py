"""SpaceInvaders' compiled CPU kernels (numba): :mod:`.rules`' ``GAME`` for one env (row ``i``) at a time.

``reset``, ``step`` and ``observe`` repeat the torch game's operations on row ``i`` of the state's arrays (its
tensors' ``.numpy()``, in :data:`STATE_KEYS` order), in place, with the same integer results: the torch game is the
definition, these are its CPU fast path. Imported only when numba is wanted.

>>> import numpy as np, torch
>>> from rlstruct.envs.minatar._space_invaders.rules import GAME
>>> state = GAME.reset(torch.zeros(2, 0, dtype=torch.float64), True)
>>> s = tuple(state[k].numpy() for k in STATE_KEYS)
>>> u = np.zeros(0)
>>> step(s, 1, 1, u, True), int(state["pos"][1]), int(state["shot_timer"][1])
((0.0, False), 4, 0)
"""

from __future__ import annotations

from rlstruct.envs._jit_kernels import jit
from rlstruct.envs.minatar._space_invaders import rules

__all__ = ["STATE_KEYS", "reset", "step", "observe"]

STATE_KEYS = ("pos", "f_bullet_map", "e_bullet_map", "alien_map", "alien_dir", "enemy_move_interval",
              "alien_move_timer", "alien_shot_timer", "ramp_index", "shot_timer")

(POS, F_BULLET_MAP, E_BULLET_MAP, ALIEN_MAP, ALIEN_DIR, ENEMY_MOVE_INTERVAL, ALIEN_MOVE_TIMER, ALIEN_SHOT_TIMER,
 RAMP_INDEX, SHOT_TIMER) = range(len(STATE_KEYS))

_jit = jit


@_jit
def _popcount(x):
    """The set bits of a 10-bit row (the torch game's parallel count, whose result it equals)."""
    x = x - ((x >> 1) & 0x155)
    x = (x & 0x333) + ((x >> 2) & 0x333)
    x = (x + (x >> 4)) & 0xF0F
    return (x & 0xFF) + (x >> 8)


@_jit
def reset(s, i, u, ramping):
    """Row ``i`` of the state tuple ``s``: the cannon in column 5 under a full wave moving left (``u``: no draws)."""
    s[POS][i] = 5
    for r in range(10):
        s[F_BULLET_MAP][i, r] = 0
        s[E_BULLET_MAP][i, r] = 0
        s[ALIEN_MAP][i, r] = rules.WAVE_ROW if r < 4 else 0
    s[ALIEN_DIR][i] = -1
    s[ENEMY_MOVE_INTERVAL][i] = rules.ENEMY_MOVE_INTERVAL
    s[ALIEN_MOVE_TIMER][i] = rules.ENEMY_MOVE_INTERVAL
    s[ALIEN_SHOT_TIMER][i] = rules.ENEMY_SHOT_INTERVAL
    s[RAMP_INDEX][i] = 0
    s[SHOT_TIMER][i] = 0


@_jit
def step(s, i, action, u, ramping):
    """Env ``i`` of ``s`` one step on, in place (``action`` in the full set; ``u``: no draws): ``(reward,
    terminated)``."""
    pos = s[POS][i]
    shot = 0
    if action == 5 and s[SHOT_TIMER][i] == 0:
        shot = 1 << pos
        s[SHOT_TIMER][i] = rules.SHOT_COOL_DOWN
    if action == 1:
        pos = max(pos - 1, 0)
    elif action == 3:
        pos = min(pos + 1, 9)
    s[POS][i] = pos

    # Friendly bullets move up a row (the new shot enters row 8), enemy bullets down; those leaving are dropped.
    for r in range(9):
        s[F_BULLET_MAP][i, r] = s[F_BULLET_MAP][i, r + 1]
    s[F_BULLET_MAP][i, 8] |= shot
    s[F_BULLET_MAP][i, 9] = 0
    for r in range(9, 0, -1):
        s[E_BULLET_MAP][i, r] = s[E_BULLET_MAP][i, r - 1]
    s[E_BULLET_MAP][i, 0] = 0
    terminal = (s[E_BULLET_MAP][i, 9] >> pos) & 1 != 0

    terminal |= (s[ALIEN_MAP][i, 9] >> pos) & 1 != 0
    direction = s[ALIEN_DIR][i]
    moves = s[ALIEN_MOVE_TIMER][i] == 0
    count = 0
    anywhere = 0
    for r in range(10):
        count += _popcount(s[ALIEN_MAP][i, r])
        anywhere |= s[ALIEN_MAP][i, r]
    timer = min(count, s[ENEMY_MOVE_INTERVAL][i]) if moves else s[ALIEN_MOVE_TIMER][i]
    if moves:
        if (anywhere & 1 != 0 and direction < 0) or (anywhere & (1 << 9) != 0 and direction > 0):
            terminal |= s[ALIEN_MAP][i, 9] != 0
            # np.roll's wrap: the bottom row comes back on top.
            last = s[ALIEN_MAP][i, 9]
            for r in range(9, 0, -1):
                s[ALIEN_MAP][i, r] = s[ALIEN_MAP][i, r - 1]
            s[ALIEN_MAP][i, 0] = last
            s[ALIEN_DIR][i] = -direction
        else:
            for r in range(10):
                row = s[ALIEN_MAP][i, r]
                s[ALIEN_MAP][i, r] = row << 1 if direction > 0 else row >> 1
            anywhere = anywhere << 1 if direction > 0 else anywhere >> 1
        terminal |= (s[ALIEN_MAP][i, 9] >> pos) & 1 != 0

    # The alien nearest the cannon fires: the nearest occupied column (the left one of a tie), its lowest alien.
    shoots = s[ALIEN_SHOT_TIMER][i] == 0
    if shoots and anywhere != 0:
        column, best = 0, 1000
        for c in range(10):
            if (anywhere >> c) & 1 != 0:
                distance = abs(c - pos) * 10 + c
                if distance < best:
                    column, best = c, distance
        row = 0
        for r in range(10):
            if (s[ALIEN_MAP][i, r] >> column) & 1 != 0:
                row = r
        s[E_BULLET_MAP][i, row] |= 1 << column

    reward = 0
    cleared = True
    for r in range(10):
        kill = s[ALIEN_MAP][i, r] & s[F_BULLET_MAP][i, r]
        reward += _popcount(kill)
        s[ALIEN_MAP][i, r] &= ~kill
        s[F_BULLET_MAP][i, r] &= ~kill
        cleared &= s[ALIEN_MAP][i, r] == 0

    if s[SHOT_TIMER][i] > 0:
        s[SHOT_TIMER][i] -= 1
    s[ALIEN_MOVE_TIMER][i] = timer - 1
    s[ALIEN_SHOT_TIMER][i] = (rules.ENEMY_SHOT_INTERVAL if shoots else s[ALIEN_SHOT_TIMER][i]) - 1
    if cleared:
        if ramping and s[ENEMY_MOVE_INTERVAL][i] > rules.FASTEST_MOVE_INTERVAL:
            s[ENEMY_MOVE_INTERVAL][i] -= 1
            s[RAMP_INDEX][i] += 1
        for r in range(4):
            s[ALIEN_MAP][i, r] = rules.WAVE_ROW
    return float(reward), terminal


@_jit
def observe(s, i, frame):
    """Env ``i``'s frame into ``frame`` (``bool [10, 10, 6]``), cleared first."""
    moving = 2 if s[ALIEN_DIR][i] < 0 else 3
    for r in range(10):
        aliens, friendly, enemy = s[ALIEN_MAP][i, r], s[F_BULLET_MAP][i, r], s[E_BULLET_MAP][i, r]
        for c in range(10):
            alien = (aliens >> c) & 1 != 0
            frame[r, c, 0] = False
            frame[r, c, 1] = alien
            frame[r, c, 2] = alien and moving == 2
            frame[r, c, 3] = alien and moving == 3
            frame[r, c, 4] = (friendly >> c) & 1 != 0
            frame[r, c, 5] = (enemy >> c) & 1 != 0
    frame[9, s[POS][i], 0] = True
