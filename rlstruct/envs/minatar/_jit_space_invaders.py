"""SpaceInvaders' compiled CPU kernels (numba): :mod:`._space_invaders`' ``GAME`` for one env (row ``i``) at a time.

``reset``, ``step`` and ``observe`` repeat the torch game's operations on row ``i`` of the state's arrays (its
tensors' ``.numpy()``, in :data:`STATE_KEYS` order), in place, with the same integer results: the torch game is the
definition, these are its CPU fast path. Imported only when numba is wanted.

>>> import numpy as np, torch
>>> from rlstruct.envs.minatar._space_invaders import GAME
>>> state = GAME.reset(torch.zeros(2, 0, dtype=torch.float64), True)
>>> s = tuple(state[k].numpy() for k in STATE_KEYS)
>>> u = np.zeros(0)
>>> step(s, 1, 1, u, True), int(state["pos"][1]), int(state["shot_timer"][1])
((0.0, False), 4, 0)
"""

from __future__ import annotations

import numba

from rlstruct.envs.minatar._space_invaders import (
    ENEMY_MOVE_INTERVAL,
    ENEMY_SHOT_INTERVAL,
    FASTEST_MOVE_INTERVAL,
    SHOT_COOL_DOWN,
    WAVE_ROW,
)

__all__ = ["STATE_KEYS", "reset", "step", "observe"]

STATE_KEYS = ("pos", "f_bullet_map", "e_bullet_map", "alien_map", "alien_dir", "enemy_move_interval",
              "alien_move_timer", "alien_shot_timer", "ramp_index", "shot_timer")

_jit = numba.njit(cache=True, nogil=True, boundscheck=False)


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
    pos, f_bullet_map, e_bullet_map, alien_map, alien_dir, enemy_move_interval, alien_move_timer, \
        alien_shot_timer, ramp_index, shot_timer = s
    pos[i] = 5
    for r in range(10):
        f_bullet_map[i, r] = 0
        e_bullet_map[i, r] = 0
        alien_map[i, r] = WAVE_ROW if r < 4 else 0
    alien_dir[i] = -1
    enemy_move_interval[i] = ENEMY_MOVE_INTERVAL
    alien_move_timer[i] = ENEMY_MOVE_INTERVAL
    alien_shot_timer[i] = ENEMY_SHOT_INTERVAL
    ramp_index[i] = 0
    shot_timer[i] = 0


@_jit
def step(s, i, action, u, ramping):
    """Env ``i`` of ``s`` one step on, in place (``action`` in the full set; ``u``: no draws): ``(reward,
    terminated)``."""
    pos_a, friendly, enemy, aliens, alien_dir, enemy_move_interval, alien_move_timer, alien_shot_timer, \
        ramp_index, shot_timer = s
    pos = pos_a[i]
    shot = 0
    if action == 5 and shot_timer[i] == 0:
        shot = 1 << pos
        shot_timer[i] = SHOT_COOL_DOWN
    if action == 1:
        pos = max(pos - 1, 0)
    elif action == 3:
        pos = min(pos + 1, 9)

    # Friendly bullets move up a row (the new shot enters row 8), enemy bullets down; those leaving are dropped.
    for r in range(9):
        friendly[i, r] = friendly[i, r + 1]
    friendly[i, 8] |= shot
    friendly[i, 9] = 0
    for r in range(9, 0, -1):
        enemy[i, r] = enemy[i, r - 1]
    enemy[i, 0] = 0
    terminal = (enemy[i, 9] >> pos) & 1 != 0

    terminal |= (aliens[i, 9] >> pos) & 1 != 0
    direction = alien_dir[i]
    moves = alien_move_timer[i] == 0
    count = 0
    anywhere = 0
    for r in range(10):
        count += _popcount(aliens[i, r])
        anywhere |= aliens[i, r]
    timer = min(count, enemy_move_interval[i]) if moves else alien_move_timer[i]
    if moves:
        if (anywhere & 1 != 0 and direction < 0) or (anywhere & (1 << 9) != 0 and direction > 0):
            terminal |= aliens[i, 9] != 0
            # np.roll's wrap: the bottom row comes back on top.
            last = aliens[i, 9]
            for r in range(9, 0, -1):
                aliens[i, r] = aliens[i, r - 1]
            aliens[i, 0] = last
            alien_dir[i] = -direction
        else:
            for r in range(10):
                aliens[i, r] = aliens[i, r] << 1 if direction > 0 else aliens[i, r] >> 1
            anywhere = anywhere << 1 if direction > 0 else anywhere >> 1
        terminal |= (aliens[i, 9] >> pos) & 1 != 0

    # The alien nearest the cannon fires: the nearest occupied column (the left one of a tie), its lowest alien.
    shoots = alien_shot_timer[i] == 0
    if shoots and anywhere != 0:
        column, best = 0, 1000
        for c in range(10):
            if (anywhere >> c) & 1 != 0:
                distance = abs(c - pos) * 10 + c
                if distance < best:
                    column, best = c, distance
        row = 0
        for r in range(10):
            if (aliens[i, r] >> column) & 1 != 0:
                row = r
        enemy[i, row] |= 1 << column

    reward = 0
    cleared = True
    for r in range(10):
        kill = aliens[i, r] & friendly[i, r]
        reward += _popcount(kill)
        aliens[i, r] &= ~kill
        friendly[i, r] &= ~kill
        cleared &= aliens[i, r] == 0

    if shot_timer[i] > 0:
        shot_timer[i] -= 1
    alien_move_timer[i] = timer - 1
    alien_shot_timer[i] = (ENEMY_SHOT_INTERVAL if shoots else alien_shot_timer[i]) - 1
    if cleared:
        if ramping and enemy_move_interval[i] > FASTEST_MOVE_INTERVAL:
            enemy_move_interval[i] -= 1
            ramp_index[i] += 1
        for r in range(4):
            aliens[i, r] = WAVE_ROW
    pos_a[i] = pos
    return float(reward), terminal


@_jit
def _put_row(frame, r, bits, channel):
    for c in range(10):
        if (bits >> c) & 1 != 0:
            frame[r, c, channel] = True


@_jit
def observe(s, i, frame):
    """Env ``i``'s frame into ``frame`` (``bool [10, 10, 6]``), cleared first."""
    pos, friendly, enemy, aliens, alien_dir = s[0], s[1], s[2], s[3], s[4]
    frame[:] = False
    frame[9, pos[i], 0] = True
    moving = 2 if alien_dir[i] < 0 else 3
    for r in range(10):
        _put_row(frame, r, aliens[i, r], 1)
        _put_row(frame, r, aliens[i, r], moving)
        _put_row(frame, r, friendly[i, r], 4)
        _put_row(frame, r, enemy[i, r], 5)
