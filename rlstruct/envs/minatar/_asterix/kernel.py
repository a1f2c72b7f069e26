"""MinAtar Asterix for one env at a time (numba): :mod:`.rules`'s rules over row ``i`` of the state arrays, for the
compiled CPU step (:mod:`rlstruct.envs.minatar._jit_driver`); the same bits as :data:`.rules.GAME`.

>>> import numpy as np, torch
>>> from rlstruct.envs.minatar._asterix.rules import GAME
>>> state = GAME.reset(torch.zeros(2, 0, dtype=torch.float64), True)
>>> s = tuple(state[k].numpy() for k in STATE_KEYS)
>>> step(s, 1, 2, np.array([0.9, 0.9, 0.99]), True), state["player_y"].tolist(), state["spawn_timer"].tolist()
((0.0, False), [5, 4], [10, 9])
"""

from __future__ import annotations

import numpy as np

from rlstruct.envs._jit_kernels import jit
from rlstruct.envs.minatar._asterix.rules import INIT_MOVE_INTERVAL, INIT_SPAWN_SPEED, RAMP_INTERVAL

__all__ = ["STATE_KEYS", "reset", "step", "observe"]

_jit = jit

STATE_KEYS = ("player_x", "player_y", "spawn_speed", "spawn_timer", "move_speed", "move_timer", "ramp_timer",
              "ramp_index", "alive", "x", "right", "gold")
_N_SLOTS = 8


@_jit
def reset(s, i, u, ramping):
    """Row ``i`` of the state ``s`` (:data:`STATE_KEYS`' arrays): a new game (``u`` is empty)."""
    px, py, spawn_speed, spawn_timer, move_speed, move_timer, ramp_timer, ramp_index, alive, x, right, gold = s
    px[i] = 5
    py[i] = 5
    spawn_speed[i] = INIT_SPAWN_SPEED
    spawn_timer[i] = INIT_SPAWN_SPEED
    move_speed[i] = INIT_MOVE_INTERVAL
    move_timer[i] = INIT_MOVE_INTERVAL
    ramp_timer[i] = RAMP_INTERVAL
    ramp_index[i] = 0
    for j in range(_N_SLOTS):
        alive[i, j] = False
        x[i, j] = 0
        right[i, j] = False
        gold[i, j] = False


@_jit
def _contact(alive, x, gold, i, j, px):
    """``(reward, terminated)`` of the player at column ``px`` meeting slot ``j`` (on its row); picked gold goes."""
    if alive[i, j] and x[i, j] == px:
        if gold[i, j]:
            alive[i, j] = False
            return 1, False
        return 0, True
    return 0, False


@_jit
def step(s, i, action, u, ramping):
    """Row ``i`` of ``s`` after the full-set action ``action`` with the draws ``u[:3]``: ``(reward, terminated)``."""
    px, py, spawn_speed, spawn_timer, move_speed, move_timer, ramp_timer, ramp_index, alive, x, right, gold = s
    spawn_v, move_v = spawn_speed[i], move_speed[i]
    timer = spawn_timer[i]
    if timer == 0:
        # The floor(k u)-th free slot, k the free slots (none: no spawn).
        free = 0
        for j in range(_N_SLOTS):
            free += not alive[i, j]
        rank = np.int64(np.floor(u[2] * np.float64(free)))
        for j in range(_N_SLOTS):
            if not alive[i, j]:
                if rank == 0:
                    from_left = u[0] < 0.5
                    alive[i, j] = True
                    x[i, j] = 0 if from_left else 9
                    right[i, j] = from_left
                    gold[i, j] = u[1] < 1 / 3
                    break
                rank -= 1
        timer = spawn_v
    col, row = px[i], py[i]
    if action == 1:
        col = max(col - 1, 0)
    elif action == 3:
        col = min(col + 1, 9)
    elif action == 2:
        row = max(row - 1, 1)
    elif action == 4:
        row = min(row + 1, 8)
    slot = row - 1
    # Contact before the entities move, then after (when they move this step).
    reward, terminated = _contact(alive, x, gold, i, slot, col)
    moves = move_timer[i] == 0
    m_timer = move_v if moves else move_timer[i]
    if moves:
        for j in range(_N_SLOTS):
            if alive[i, j]:
                x[i, j] += 1 if right[i, j] else -1
    for j in range(_N_SLOTS):
        alive[i, j] = alive[i, j] and 0 <= x[i, j] <= 9
    if moves:
        r, t = _contact(alive, x, gold, i, slot, col)
        reward += r
        terminated = terminated or t
    px[i] = col
    py[i] = row
    spawn_timer[i] = timer - 1
    move_timer[i] = m_timer - 1
    if ramping:
        ramps = spawn_v > 1 or move_v > 1
        bump = ramps and ramp_timer[i] < 0
        if bump:
            if move_v > 1 and (ramp_index[i] & 1) == 1:
                move_speed[i] = move_v - 1
            if spawn_v > 1:
                spawn_speed[i] = spawn_v - 1
            ramp_index[i] += 1
            ramp_timer[i] = RAMP_INTERVAL
        elif ramps:
            ramp_timer[i] -= 1
    return np.float64(reward), terminated


@_jit
def observe(s, i, frame):
    """Row ``i``'s frame into ``frame`` (``bool [10, 10, 4]``), cleared first."""
    px, py, spawn_speed, spawn_timer, move_speed, move_timer, ramp_timer, ramp_index, alive, x, right, gold = s
    frame[:] = False
    frame[py[i], px[i], 0] = True
    for j in range(_N_SLOTS):
        if alive[i, j]:
            c = x[i, j]
            frame[j + 1, c, 3 if gold[i, j] else 1] = True
            back = c - (1 if right[i, j] else -1)
            if 0 <= back <= 9:
                frame[j + 1, back, 2] = True
