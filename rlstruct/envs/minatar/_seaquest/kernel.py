"""Seaquest's compiled CPU kernels (numba): :mod:`.rules`'s ``GAME`` for one env (row ``i``) at a time.

``reset``, ``step`` and ``observe`` repeat the torch game's operations on row ``i`` of the state's arrays (its
tensors' ``.numpy()``, in :data:`STATE_KEYS` order), in place, with the same results, dead slots included (their
timers run on, the bullets' and divers' are moved to the back the same stable way): the torch game is the definition,
these are its CPU fast path. Imported only when numba is wanted.

The step is written so that numba counts no references to the state's arrays (which would cost as much as the step):
one function, the arrays read as ``s[ENEMY_X]`` (constant indices), never bound to names or passed on; a value a
branch changes is read into a local before it and written back after it; the last statements run on every path.

>>> import numpy as np, torch
>>> from rlstruct.envs.minatar._seaquest.rules import GAME
>>> state = GAME.reset(torch.zeros(2, 0, dtype=torch.float64), True)
>>> s = tuple(state[k].numpy() for k in STATE_KEYS)
>>> step(s, 0, 4, np.full(5, 0.5), True), int(state["sub_y"][0]), int(state["sub_y"][1])
((0.0, False), 1, 0)
"""

from __future__ import annotations

from rlstruct.envs._jit_kernels import jit
from rlstruct.envs.minatar._seaquest.rules import (
    _SCALARS,
    _SUB_RANK,
    DIVER_MOVE_INTERVAL,
    DIVER_SPAWN_SPEED,
    ENEMY_SHOT_INTERVAL,
    MAX_BULLETS,
    MAX_DIVERS,
    MAX_DIVERS_HELD,
    MAX_ENEMIES,
    MAX_OXYGEN,
    SHOT_COOL_DOWN,
)

__all__ = ["STATE_KEYS", "reset", "step", "observe"]

STATE_KEYS = (*_SCALARS, "sub_or", "surface",
              "enemy_x", "enemy_y", "enemy_move", "enemy_shot", "enemy_birth", "enemy_alive", "enemy_lr", "enemy_sub",
              "bullet_x", "bullet_y", "bullet_alive", "bullet_lr",
              "diver_x", "diver_y", "diver_move", "diver_alive", "diver_lr", "enemy_bullets")
(OXYGEN, DIVER_COUNT, SUB_X, SUB_Y, SHOT_TIMER, E_SPAWN_SPEED, E_SPAWN_TIMER, D_SPAWN_TIMER, MOVE_SPEED, RAMP_INDEX,
 N_SPAWNED, SUB_OR, SURFACE, ENEMY_X, ENEMY_Y, ENEMY_MOVE, ENEMY_SHOT, ENEMY_BIRTH, ENEMY_ALIVE, ENEMY_LR, ENEMY_SUB,
 BULLET_X, BULLET_Y, BULLET_ALIVE, BULLET_LR, DIVER_X, DIVER_Y, DIVER_MOVE, DIVER_ALIVE, DIVER_LR,
 ENEMY_BULLETS) = range(len(STATE_KEYS))
_START = tuple(_SCALARS.values())
_NO_KEY = 2**31 - 1
# Kills are bit masks of enemy slots; a group of two slots is compacted by one swap.
assert MAX_ENEMIES <= 63 and MAX_BULLETS == MAX_DIVERS == 2

_jit = jit


@_jit
def _step_x(lr):
    return 1 if lr else -1


@_jit
def _clear(i, ints, flags):
    """Row ``i`` of a group's slot arrays (``ints``, ``flags``) zeroed."""
    for a in ints:
        a[i, :] = 0
    for a in flags:
        a[i, :] = False


@_jit
def reset(s, i, u, ramping):
    """Row ``i`` of the state tuple ``s``: the sub at the surface, full oxygen, nothing else (``u``: no draws)."""
    scalars = s[:11]
    for k in range(len(_START)):
        scalars[k][i] = _START[k]
    s[11][i] = False
    s[12][i] = True
    _clear(i, s[13:18], s[18:21])
    _clear(i, s[21:23], s[23:25])
    _clear(i, s[25:28], s[28:30])
    s[30][i] = False


@_jit
def step(s, i, action, u, ramping):
    """Env ``i`` of ``s`` one step on, in place (``action`` in the full set, ``u``: its 5 draws): ``(reward,
    terminated)``.

    The torch game's parts in its order (the timers last: nothing after them in the torch step reads them).
    """
    # An enemy spawns (unless its row holds one going the other way) and a diver, each when its timer is 0.
    u0, u1, u2, u3, u4 = u[0], u[1], u[2], u[3], u[4]
    spawn = s[E_SPAWN_TIMER][i] == 0
    if spawn:
        lr = u0 < 0.5
        row = 1 + int(u2 * 8)
        blocked = False
        e = -1
        for j in range(MAX_ENEMIES):
            if s[ENEMY_ALIVE][i, j]:
                blocked |= s[ENEMY_Y][i, j] == row and s[ENEMY_LR][i, j] != lr
            elif e < 0:
                e = j
        if not blocked:
            e = max(e, 0)  # slot 0 when none is free, as the torch game's argmax
            s[ENEMY_X][i, e] = 0 if lr else 9
            s[ENEMY_Y][i, e] = row
            s[ENEMY_MOVE][i, e] = s[MOVE_SPEED][i]
            s[ENEMY_SHOT][i, e] = ENEMY_SHOT_INTERVAL
            s[ENEMY_BIRTH][i, e] = s[N_SPAWNED][i]
            s[ENEMY_ALIVE][i, e] = True
            s[ENEMY_LR][i, e] = lr
            s[ENEMY_SUB][i, e] = u1 < 1 / 3
            s[N_SPAWNED][i] += 1
        s[E_SPAWN_TIMER][i] = s[E_SPAWN_SPEED][i]
    if s[D_SPAWN_TIMER][i] == 0:
        lr = (u3 if spawn else u0) < 0.5
        d = 0 if not s[DIVER_ALIVE][i, 0] else 1 if not s[DIVER_ALIVE][i, 1] else 0
        s[DIVER_X][i, d] = 0 if lr else 9
        s[DIVER_Y][i, d] = 1 + int((u4 if spawn else u1) * 8)
        s[DIVER_MOVE][i, d] = DIVER_MOVE_INTERVAL
        s[DIVER_ALIVE][i, d] = True
        s[DIVER_LR][i, d] = lr
        s[D_SPAWN_TIMER][i] = DIVER_SPAWN_SPEED
    # The sub fires (when the gun is cool) or moves; left and right also turn it.
    sub_x, sub_y, sub_or, shot_timer = s[SUB_X][i], s[SUB_Y][i], s[SUB_OR][i], s[SHOT_TIMER][i]
    if action == 5 and shot_timer == 0:
        b = 0 if not s[BULLET_ALIVE][i, 0] else 1 if not s[BULLET_ALIVE][i, 1] else 0
        s[BULLET_X][i, b] = sub_x
        s[BULLET_Y][i, b] = sub_y
        s[BULLET_ALIVE][i, b] = True
        s[BULLET_LR][i, b] = sub_or
        shot_timer = SHOT_COOL_DOWN
    if action == 1:
        sub_x, sub_or = max(sub_x - 1, 0), False
    elif action == 3:
        sub_x, sub_or = min(sub_x + 1, 9), True
    elif action == 2:
        sub_y = max(sub_y - 1, 0)
    elif action == 4:
        sub_y = min(sub_y + 1, 8)
    s[SUB_X][i], s[SUB_Y][i], s[SUB_OR][i] = sub_x, sub_y, sub_or
    # The friendly bullets move; each kills the oldest fish in its new cell, else the oldest sub (of the enemies
    # alive before any of them).
    reward, killed = 0, 0
    for b in range(MAX_BULLETS):
        alive = s[BULLET_ALIVE][i, b]
        x = s[BULLET_X][i, b] + _step_x(s[BULLET_LR][i, b]) if alive else s[BULLET_X][i, b]
        alive = alive and 0 <= x <= 9
        best, best_key = -1, _NO_KEY
        if alive:
            y = s[BULLET_Y][i, b]
            for e in range(MAX_ENEMIES):
                if s[ENEMY_ALIVE][i, e] and s[ENEMY_X][i, e] == x and s[ENEMY_Y][i, e] == y:
                    key = _SUB_RANK * s[ENEMY_SUB][i, e] + s[ENEMY_BIRTH][i, e]
                    if key < best_key:
                        best, best_key = e, key
        s[BULLET_X][i, b] = x
        if best >= 0:
            killed |= 1 << best
            reward += 1
            alive = False
        s[BULLET_ALIVE][i, b] = alive
    if killed != 0:
        for e in range(MAX_ENEMIES):
            if (killed >> e) & 1:
                s[ENEMY_ALIVE][i, e] = False
    # Divers in the sub's cell (before or after their move) board it, newest first, while it holds fewer than 6.
    sub_x, sub_y = s[SUB_X][i], s[SUB_Y][i]
    count = s[DIVER_COUNT][i]
    for d in range(MAX_DIVERS - 1, -1, -1):
        old_x, moves = s[DIVER_X][i, d], s[DIVER_MOVE][i, d] == 0
        x = old_x + _step_x(s[DIVER_LR][i, d]) if moves else old_x
        inside = 0 <= x <= 9
        boards = (s[DIVER_ALIVE][i, d] and s[DIVER_Y][i, d] == sub_y
                  and (old_x == sub_x or (moves and inside and x == sub_x)))
        boarded = boards and count < MAX_DIVERS_HELD
        count += boarded
        s[DIVER_ALIVE][i, d] = s[DIVER_ALIVE][i, d] and inside and not boarded
        s[DIVER_X][i, d] = x
        s[DIVER_MOVE][i, d] = DIVER_MOVE_INTERVAL if moves else s[DIVER_MOVE][i, d] - 1
    s[DIVER_COUNT][i] = count
    # The enemies move, subs fire, and an enemy moving onto a friendly bullet dies with it: each bullet takes the
    # newest sub landing in its cell, else the newest fish.
    move_speed = s[MOVE_SPEED][i]
    player_hit = False
    landed = 0
    for e in range(MAX_ENEMIES):
        alive, old_x, y = s[ENEMY_ALIVE][i, e], s[ENEMY_X][i, e], s[ENEMY_Y][i, e]
        moves = alive and s[ENEMY_MOVE][i, e] == 0
        s[ENEMY_MOVE][i, e] = move_speed if moves else s[ENEMY_MOVE][i, e] - 1
        if s[ENEMY_SUB][i, e]:
            shot = s[ENEMY_SHOT][i, e]
            s[ENEMY_SHOT][i, e] = ENEMY_SHOT_INTERVAL if shot == 0 else shot - 1
        else:
            shot = 1
        if not alive:
            continue
        player_hit |= old_x == sub_x and y == sub_y
        x = old_x + _step_x(s[ENEMY_LR][i, e]) if moves else old_x
        if moves and not 0 <= x <= 9:
            s[ENEMY_ALIVE][i, e] = False
            s[ENEMY_X][i, e] = x
            continue
        s[ENEMY_X][i, e] = x
        if shot == 0:
            s[ENEMY_BULLETS][i, 1 if s[ENEMY_LR][i, e] else 0, y, x] = True
        if moves:
            if x == sub_x and y == sub_y:
                player_hit = True
            else:
                landed |= 1 << e
    killed = 0
    if landed != 0:
        for b in range(MAX_BULLETS):
            best, best_key = -1, -1
            alive, bx, by = s[BULLET_ALIVE][i, b], s[BULLET_X][i, b], s[BULLET_Y][i, b]
            for e in range(MAX_ENEMIES):
                if alive and (landed >> e) & 1 and s[ENEMY_X][i, e] == bx and s[ENEMY_Y][i, e] == by:
                    key = _SUB_RANK * s[ENEMY_SUB][i, e] + s[ENEMY_BIRTH][i, e]
                    if key > best_key:
                        best, best_key = e, key
            if best >= 0:
                killed |= 1 << best
                reward += 1
                s[BULLET_ALIVE][i, b] = False
    if killed != 0:
        for e in range(MAX_ENEMIES):
            if (killed >> e) & 1:
                s[ENEMY_ALIVE][i, e] = False
    # The enemy bullets move a cell (left ones left, right ones right): one in the player's cell before or after
    # ends the game.
    hit = s[ENEMY_BULLETS][i, 0, sub_y, sub_x] or s[ENEMY_BULLETS][i, 1, sub_y, sub_x]
    for y in range(10):
        for x in range(9):
            s[ENEMY_BULLETS][i, 0, y, x] = s[ENEMY_BULLETS][i, 0, y, x + 1]
        s[ENEMY_BULLETS][i, 0, y, 9] = False
        for x in range(9, 0, -1):
            s[ENEMY_BULLETS][i, 1, y, x] = s[ENEMY_BULLETS][i, 1, y, x - 1]
        s[ENEMY_BULLETS][i, 1, y, 0] = False
    terminal = player_hit or hit or s[ENEMY_BULLETS][i, 0, sub_y, sub_x] or s[ENEMY_BULLETS][i, 1, sub_y, sub_x]
    # Timers, oxygen and surfacing (the oxygen bonus with 6 divers, the difficulty ramp); out of oxygen, or
    # surfacing with no diver, ends the game.
    oxygen, count, surface, ramp_index = s[OXYGEN][i], s[DIVER_COUNT][i], s[SURFACE][i], s[RAMP_INDEX][i]
    spawn_speed, speed = s[E_SPAWN_SPEED][i], s[MOVE_SPEED][i]
    terminal |= oxygen <= 0
    if sub_y > 0:
        oxygen -= 1
        surface = False
    elif not surface:
        if count == 0:
            terminal = True
        else:
            if count == MAX_DIVERS_HELD:
                reward += oxygen * 10 // MAX_OXYGEN
                count = 0
            count -= 1
            oxygen = MAX_OXYGEN
            surface = True
            if ramping and (spawn_speed > 1 or speed > 2):
                if speed > 2 and ramp_index % 2 == 1:
                    speed -= 1
                if spawn_speed > 1:
                    spawn_speed -= 1
                ramp_index += 1
    s[OXYGEN][i], s[DIVER_COUNT][i], s[SURFACE][i], s[RAMP_INDEX][i] = oxygen, count, surface, ramp_index
    s[E_SPAWN_SPEED][i], s[MOVE_SPEED][i] = spawn_speed, speed
    # The live bullets and divers move to the front of their slots, in order (the dead ones after them, in order).
    if s[BULLET_ALIVE][i, 1] and not s[BULLET_ALIVE][i, 0]:
        s[BULLET_X][i, 0], s[BULLET_X][i, 1] = s[BULLET_X][i, 1], s[BULLET_X][i, 0]
        s[BULLET_Y][i, 0], s[BULLET_Y][i, 1] = s[BULLET_Y][i, 1], s[BULLET_Y][i, 0]
        s[BULLET_LR][i, 0], s[BULLET_LR][i, 1] = s[BULLET_LR][i, 1], s[BULLET_LR][i, 0]
        s[BULLET_ALIVE][i, 0], s[BULLET_ALIVE][i, 1] = True, False
    if s[DIVER_ALIVE][i, 1] and not s[DIVER_ALIVE][i, 0]:
        s[DIVER_X][i, 0], s[DIVER_X][i, 1] = s[DIVER_X][i, 1], s[DIVER_X][i, 0]
        s[DIVER_Y][i, 0], s[DIVER_Y][i, 1] = s[DIVER_Y][i, 1], s[DIVER_Y][i, 0]
        s[DIVER_MOVE][i, 0], s[DIVER_MOVE][i, 1] = s[DIVER_MOVE][i, 1], s[DIVER_MOVE][i, 0]
        s[DIVER_LR][i, 0], s[DIVER_LR][i, 1] = s[DIVER_LR][i, 1], s[DIVER_LR][i, 0]
        s[DIVER_ALIVE][i, 0], s[DIVER_ALIVE][i, 1] = True, False
    # The timers run down (last: nothing above reads them).
    s[E_SPAWN_TIMER][i] -= s[E_SPAWN_TIMER][i] > 0
    s[D_SPAWN_TIMER][i] -= s[D_SPAWN_TIMER][i] > 0
    s[SHOT_TIMER][i] = shot_timer - (shot_timer > 0)
    return float(reward), terminal


@_jit
def observe(s, i, frame):
    """Env ``i``'s frame into ``frame`` (``bool [10, 10, 10]``), cleared first."""
    for y in range(10):
        for x in range(10):
            for c in range(10):
                frame[y, x, c] = False
            frame[y, x, 4] = s[ENEMY_BULLETS][i, 0, y, x] or s[ENEMY_BULLETS][i, 1, y, x]
    sub_x, sub_y = s[SUB_X][i], s[SUB_Y][i]
    frame[sub_y, sub_x, 0] = True
    frame[sub_y, sub_x - _step_x(s[SUB_OR][i]), 1] = True
    for b in range(MAX_BULLETS):
        if s[BULLET_ALIVE][i, b]:
            frame[s[BULLET_Y][i, b], s[BULLET_X][i, b], 2] = True
    for e in range(MAX_ENEMIES):
        if s[ENEMY_ALIVE][i, e]:
            x, y = s[ENEMY_X][i, e], s[ENEMY_Y][i, e]
            frame[y, x, 6 if s[ENEMY_SUB][i, e] else 5] = True
            trail = x - _step_x(s[ENEMY_LR][i, e])
            if 0 <= trail <= 9:
                frame[y, trail, 3] = True
    for d in range(MAX_DIVERS):
        if s[DIVER_ALIVE][i, d]:
            x, y = s[DIVER_X][i, d], s[DIVER_Y][i, d]
            frame[y, x, 9] = True
            trail = x - _step_x(s[DIVER_LR][i, d])
            if 0 <= trail <= 9:
                frame[y, trail, 3] = True
    bar = max(s[OXYGEN][i], 0) * 10 // MAX_OXYGEN
    count = s[DIVER_COUNT][i]
    for x in range(10):
        frame[9, x, 7] = x < bar
        frame[9, x, 8] = 9 - count <= x < 9
