"""Seaquest's compiled CPU kernels (numba): :mod:`._seaquest`'s ``GAME`` for one env (row ``i``) at a time.

``reset``, ``step`` and ``observe`` repeat the torch game's operations on row ``i`` of the state's arrays (its
tensors' ``.numpy()``, in :data:`STATE_KEYS` order), in place, with the same results, dead slots included (their
timers run on, the bullets' and divers' are moved to the back the same stable way): the torch game is the definition,
these are its CPU fast path. Sets of enemy slots (a step's kills) are bit masks, ``MAX_ENEMIES <= 63``. Imported only
when numba is wanted.

>>> import numpy as np, torch
>>> from rlstruct.envs.minatar._seaquest import GAME
>>> state = GAME.reset(torch.zeros(2, 0, dtype=torch.float64), True)
>>> s = tuple(state[k].numpy() for k in STATE_KEYS)
>>> step(s, 0, 4, np.full(5, 0.5), True), int(state["sub_y"][0]), int(state["sub_y"][1])
((0.0, False), 1, 0)
"""

from __future__ import annotations

import numba

from rlstruct.envs.minatar._seaquest import (
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
_START = tuple(_SCALARS.values())
_NO_KEY = 2**31 - 1
assert MAX_ENEMIES <= 63

_jit = numba.njit(cache=True, nogil=True, boundscheck=False)


@_jit
def _step_x(lr):
    return 1 if lr else -1


@_jit
def _free(alive, i, k):
    """The first dead slot of row ``i`` (slot 0 if none, as the torch game's ``argmax``)."""
    for j in range(k):
        if not alive[i, j]:
            return j
    return 0


@_jit
def _rotate(a, i, first, last):
    """Row ``i``'s slots ``first..last`` of ``a`` turned one to the right: ``last`` moves to ``first``."""
    kept = a[i, last]
    for j in range(last, first, -1):
        a[i, j] = a[i, j - 1]
    a[i, first] = kept


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
def _spawn(s, i, u):
    """An enemy (unless its row holds one going the other way) and a diver, each when its timer is 0."""
    e_spawn_speed, e_spawn_timer, d_spawn_timer, move_speed, n_spawned = s[5], s[6], s[7], s[8], s[10]
    enemy_x, enemy_y, enemy_move, enemy_shot, enemy_birth, enemy_alive, enemy_lr, enemy_sub = s[13:21]
    diver_x, diver_y, diver_move, diver_alive, diver_lr = s[25:30]
    spawn = e_spawn_timer[i] == 0
    if spawn:
        lr = u[0] < 0.5
        row = 1 + int(u[2] * 8)
        blocked = False
        for e in range(MAX_ENEMIES):
            blocked |= enemy_alive[i, e] and enemy_y[i, e] == row and enemy_lr[i, e] != lr
        if not blocked:
            e = _free(enemy_alive, i, MAX_ENEMIES)
            enemy_x[i, e] = 9 if not lr else 0
            enemy_y[i, e] = row
            enemy_move[i, e] = move_speed[i]
            enemy_shot[i, e] = ENEMY_SHOT_INTERVAL
            enemy_birth[i, e] = n_spawned[i]
            enemy_alive[i, e] = True
            enemy_lr[i, e] = lr
            enemy_sub[i, e] = u[1] < 1 / 3
            n_spawned[i] += 1
        e_spawn_timer[i] = e_spawn_speed[i]
    if d_spawn_timer[i] == 0:
        lr = (u[3] if spawn else u[0]) < 0.5
        d = _free(diver_alive, i, MAX_DIVERS)
        diver_x[i, d] = 9 if not lr else 0
        diver_y[i, d] = 1 + int((u[4] if spawn else u[1]) * 8)
        diver_move[i, d] = DIVER_MOVE_INTERVAL
        diver_alive[i, d] = True
        diver_lr[i, d] = lr
        d_spawn_timer[i] = DIVER_SPAWN_SPEED


@_jit
def _act(s, i, action):
    """Fires (when the gun is cool) or moves the sub; left and right also turn it."""
    sub_x, sub_y, shot_timer, sub_or = s[2], s[3], s[4], s[11]
    bullet_x, bullet_y, bullet_alive, bullet_lr = s[21:25]
    if action == 5 and shot_timer[i] == 0:
        b = _free(bullet_alive, i, MAX_BULLETS)
        bullet_x[i, b] = sub_x[i]
        bullet_y[i, b] = sub_y[i]
        bullet_alive[i, b] = True
        bullet_lr[i, b] = sub_or[i]
        shot_timer[i] = SHOT_COOL_DOWN
    if action == 1:
        sub_x[i] = max(sub_x[i] - 1, 0)
        sub_or[i] = False
    elif action == 3:
        sub_x[i] = min(sub_x[i] + 1, 9)
        sub_or[i] = True
    elif action == 2:
        sub_y[i] = max(sub_y[i] - 1, 0)
    elif action == 4:
        sub_y[i] = min(sub_y[i] + 1, 8)


@_jit
def _move_bullets(s, i):
    """Moves the friendly bullets; each kills the oldest fish in its new cell, else the oldest sub (the enemies
    alive before any of them). Returns the kills."""
    enemy_x, enemy_y, enemy_birth, enemy_alive, enemy_sub = s[13], s[14], s[17], s[18], s[20]
    bullet_x, bullet_y, bullet_alive, bullet_lr = s[21:25]
    hits, killed = 0, 0
    for b in range(MAX_BULLETS):
        alive = bullet_alive[i, b]
        x = bullet_x[i, b] + _step_x(bullet_lr[i, b]) if alive else bullet_x[i, b]
        alive = alive and 0 <= x <= 9
        best, best_key = -1, _NO_KEY
        if alive:
            y = bullet_y[i, b]
            for e in range(MAX_ENEMIES):
                if enemy_alive[i, e] and enemy_x[i, e] == x and enemy_y[i, e] == y:
                    key = _SUB_RANK * enemy_sub[i, e] + enemy_birth[i, e]
                    if key < best_key:
                        best, best_key = e, key
        bullet_x[i, b] = x
        if best >= 0:
            killed |= 1 << best
            hits += 1
            alive = False
        bullet_alive[i, b] = alive
    _kill(enemy_alive, i, killed)
    return hits


@_jit
def _kill(alive, i, killed):
    """Slots ``killed`` (a bit mask) of row ``i`` die."""
    if killed != 0:
        for e in range(MAX_ENEMIES):
            if (killed >> e) & 1:
                alive[i, e] = False


@_jit
def _move_divers(s, i):
    """Divers in the sub's cell (before or after their move) board it, newest first, while it holds fewer than 6."""
    diver_count, sub_x, sub_y = s[1], s[2][i], s[3][i]
    diver_x, diver_y, diver_move, diver_alive, diver_lr = s[25:30]
    count = diver_count[i]
    for d in range(MAX_DIVERS - 1, -1, -1):
        moves = diver_move[i, d] == 0
        x = diver_x[i, d] + _step_x(diver_lr[i, d]) if moves else diver_x[i, d]
        inside = 0 <= x <= 9
        boards = (diver_alive[i, d] and diver_y[i, d] == sub_y
                  and (diver_x[i, d] == sub_x or (moves and inside and x == sub_x)))
        boarded = boards and count < MAX_DIVERS_HELD
        count += boarded
        diver_alive[i, d] = diver_alive[i, d] and inside and not boarded
        diver_x[i, d] = x
        diver_move[i, d] = DIVER_MOVE_INTERVAL if moves else diver_move[i, d] - 1
    diver_count[i] = count


@_jit
def _move_enemies(s, i):
    """Moves the enemies, subs fire, and an enemy moving onto a friendly bullet dies with it: each bullet takes the
    newest sub landing in its cell, else the newest fish. Returns ``(kills, player hit)``."""
    sub_x, sub_y, move_speed = s[2][i], s[3][i], s[8][i]
    enemy_x, enemy_y, enemy_move, enemy_shot, enemy_birth, enemy_alive, enemy_lr, enemy_sub = s[13:21]
    bullet_x, bullet_y, bullet_alive = s[21], s[22], s[23]
    grids = s[30]
    player_hit = False
    landed = 0
    for e in range(MAX_ENEMIES):
        alive, is_sub, y = enemy_alive[i, e], enemy_sub[i, e], enemy_y[i, e]
        player_hit |= alive and enemy_x[i, e] == sub_x and y == sub_y
        moves = alive and enemy_move[i, e] == 0
        x = enemy_x[i, e] + _step_x(enemy_lr[i, e]) if moves else enemy_x[i, e]
        out = moves and not 0 <= x <= 9
        on_player = moves and not out and x == sub_x and y == sub_y
        player_hit |= on_player
        if is_sub:
            if enemy_shot[i, e] == 0:
                enemy_shot[i, e] = ENEMY_SHOT_INTERVAL
                if alive and not out:
                    grids[i, 1 if enemy_lr[i, e] else 0, y, x] = True
            else:
                enemy_shot[i, e] -= 1
        enemy_move[i, e] = move_speed if moves else enemy_move[i, e] - 1
        enemy_x[i, e] = x
        if out:
            enemy_alive[i, e] = False
        if moves and not out and not on_player:
            landed |= 1 << e
    hits, killed = 0, 0
    if landed != 0:
        for b in range(MAX_BULLETS):
            if not bullet_alive[i, b]:
                continue
            best, best_key = -1, -1
            for e in range(MAX_ENEMIES):
                if (landed >> e) & 1 and enemy_x[i, e] == bullet_x[i, b] and enemy_y[i, e] == bullet_y[i, b]:
                    key = _SUB_RANK * enemy_sub[i, e] + enemy_birth[i, e]
                    if key > best_key:
                        best, best_key = e, key
            if best >= 0:
                killed |= 1 << best
                hits += 1
                bullet_alive[i, b] = False
    _kill(enemy_alive, i, killed)
    return hits, player_hit


@_jit
def _move_enemy_bullets(s, i):
    """Moves the enemy bullets a cell (left ones left, right ones right); whether one is in the player's cell
    before or after."""
    sub_x, sub_y, grids = s[2][i], s[3][i], s[30]
    hit = grids[i, 0, sub_y, sub_x] or grids[i, 1, sub_y, sub_x]
    for y in range(10):
        for x in range(9):
            grids[i, 0, y, x] = grids[i, 0, y, x + 1]
        grids[i, 0, y, 9] = False
        for x in range(9, 0, -1):
            grids[i, 1, y, x] = grids[i, 1, y, x - 1]
        grids[i, 1, y, 0] = False
    return hit or grids[i, 0, sub_y, sub_x] or grids[i, 1, sub_y, sub_x]


@_jit
def _breathe(s, i, ramping):
    """Timers, oxygen and surfacing (with the difficulty ramp). Returns ``(oxygen bonus, terminal)``."""
    oxygen_a, diver_count, sub_y, shot_timer, e_spawn_speed, e_spawn_timer, d_spawn_timer, move_speed, \
        ramp_index = s[0], s[1], s[3], s[4], s[5], s[6], s[7], s[8], s[9]
    surface = s[12]
    for timer in (e_spawn_timer, d_spawn_timer, shot_timer):
        if timer[i] > 0:
            timer[i] -= 1
    oxygen, count = oxygen_a[i], diver_count[i]
    terminal = oxygen <= 0
    reward = 0
    if sub_y[i] > 0:
        oxygen_a[i] = oxygen - 1
        surface[i] = False
    elif not surface[i]:
        if count == 0:
            terminal = True
        else:
            if count == MAX_DIVERS_HELD:
                reward = oxygen * 10 // MAX_OXYGEN
                count = 0
            diver_count[i] = count - 1
            oxygen_a[i] = MAX_OXYGEN
            surface[i] = True
            spawn_speed, speed = e_spawn_speed[i], move_speed[i]
            if ramping and (spawn_speed > 1 or speed > 2):
                if speed > 2 and ramp_index[i] % 2 == 1:
                    move_speed[i] = speed - 1
                if spawn_speed > 1:
                    e_spawn_speed[i] = spawn_speed - 1
                ramp_index[i] += 1
    return reward, terminal


@_jit
def _compact(i, k, ints, flags):
    """Row ``i``'s live slots of a group moved to the front, in order, the dead ones after them in order; ``ints``
    and ``flags``: the group's arrays, ``flags[0]`` its ``alive``."""
    first = 0
    for j in range(k):
        if flags[0][i, j]:
            if j > first:
                for a in ints:
                    _rotate(a, i, first, j)
                for a in flags:
                    _rotate(a, i, first, j)
            first += 1


@_jit
def step(s, i, action, u, ramping):
    """Env ``i`` of ``s`` one step on, in place (``action`` in the full set, ``u``: its 5 draws): ``(reward,
    terminated)``."""
    _spawn(s, i, u)
    _act(s, i, action)
    reward = _move_bullets(s, i)
    _move_divers(s, i)
    hits, player_hit = _move_enemies(s, i)
    terminal = _move_enemy_bullets(s, i) or player_hit
    bonus, drowned = _breathe(s, i, ramping)
    _compact(i, MAX_BULLETS, s[21:23], s[23:25])
    _compact(i, MAX_DIVERS, s[25:28], s[28:30])
    return float(reward + hits + bonus), terminal or drowned


@_jit
def _put(frame, x, y, channel):
    frame[y, x, channel] = True


@_jit
def observe(s, i, frame):
    """Env ``i``'s frame into ``frame`` (``bool [10, 10, 10]``), cleared first."""
    oxygen, diver_count, sub_x, sub_y, sub_or = s[0][i], s[1][i], s[2][i], s[3][i], s[11][i]
    enemy_x, enemy_y, enemy_alive, enemy_lr, enemy_sub = s[13], s[14], s[18], s[19], s[20]
    bullet_x, bullet_y, bullet_alive = s[21], s[22], s[23]
    diver_x, diver_y, diver_alive, diver_lr = s[25], s[26], s[28], s[29]
    grids = s[30]
    frame[:] = False
    _put(frame, sub_x, sub_y, 0)
    _put(frame, sub_x - _step_x(sub_or), sub_y, 1)
    for b in range(MAX_BULLETS):
        if bullet_alive[i, b]:
            _put(frame, bullet_x[i, b], bullet_y[i, b], 2)
    for e in range(MAX_ENEMIES):
        if enemy_alive[i, e]:
            _put(frame, enemy_x[i, e], enemy_y[i, e], 6 if enemy_sub[i, e] else 5)
            trail = enemy_x[i, e] - _step_x(enemy_lr[i, e])
            if 0 <= trail <= 9:
                _put(frame, trail, enemy_y[i, e], 3)
    for d in range(MAX_DIVERS):
        if diver_alive[i, d]:
            _put(frame, diver_x[i, d], diver_y[i, d], 9)
            trail = diver_x[i, d] - _step_x(diver_lr[i, d])
            if 0 <= trail <= 9:
                _put(frame, trail, diver_y[i, d], 3)
    for y in range(10):
        for x in range(10):
            frame[y, x, 4] = grids[i, 0, y, x] or grids[i, 1, y, x]
    bar = max(oxygen, 0) * 10 // MAX_OXYGEN
    for x in range(10):
        frame[9, x, 7] = x < bar
        frame[9, x, 8] = 9 - diver_count <= x < 9
