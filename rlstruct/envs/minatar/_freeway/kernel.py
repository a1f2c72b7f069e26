"""MinAtar Freeway for one env at a time (numba): :mod:`.rules`'s rules over row ``i`` of the state arrays, for the
compiled CPU step (:mod:`rlstruct.envs.minatar._jit_driver`); the same bits as :data:`.rules.GAME`.

>>> import numpy as np, torch
>>> from rlstruct.envs.minatar._freeway.rules import GAME
>>> u = np.full(16, 0.9)
>>> state = GAME.reset(torch.from_numpy(u).expand(2, 16), True)
>>> s = tuple(state[k].numpy() for k in STATE_KEYS)
>>> step(s, 1, 2, u, True), state["car_timer"][1].tolist(), state["pos"].tolist()
((0.0, False), [4, 4, 4, 4, 4, 4, 4, 4], [9, 9])
"""

from __future__ import annotations

import numpy as np

from rlstruct.envs._jit_kernels import jit
from rlstruct.envs.minatar._freeway.rules import PLAYER_SPEED, TIME_LIMIT

__all__ = ["STATE_KEYS", "reset", "step", "observe"]

_jit = jit

STATE_KEYS = ("pos", "move_timer", "terminate_timer", "car_x", "car_timer", "car_speed")
_N_CARS = 8


@_jit
def _new_cars(car_timer, car_speed, i, u):
    """Row ``i``'s car speeds and timers from minatar's ``_randomize_cars`` draws ``u[:16]``."""
    for k in range(_N_CARS):
        v = u[_N_CARS + k] - 0.5
        sign = 1 if v > 0 else (-1 if v < 0 else 0)
        speed = (1 + np.int64(np.floor(u[k] * 5.0))) * sign
        car_speed[i, k] = speed
        car_timer[i, k] = abs(speed)


@_jit
def reset(s, i, u, ramping):
    """Row ``i`` of the state ``s`` (:data:`STATE_KEYS`' arrays): a new game from the draws ``u[:16]``."""
    pos, move_timer, terminate_timer, car_x, car_timer, car_speed = s
    pos[i] = 9
    move_timer[i] = PLAYER_SPEED
    terminate_timer[i] = TIME_LIMIT
    for k in range(_N_CARS):
        car_x[i, k] = 0
    _new_cars(car_timer, car_speed, i, u)


@_jit
def _wrap(x):
    return 9 if x < 0 else (0 if x > 9 else x)


@_jit
def step(s, i, action, u, ramping):
    """Row ``i`` of ``s`` after the full-set action ``action`` with the draws ``u[:16]``: ``(reward, terminated)``."""
    pos, move_timer, terminate_timer, car_x, car_timer, car_speed = s
    p, timer = pos[i], move_timer[i]
    if timer == 0 and (action == 2 or action == 4):
        timer = PLAYER_SPEED
        p = max(p - 1, 0) if action == 2 else min(p + 1, 9)
    win = p == 0
    if win:
        _new_cars(car_timer, car_speed, i, u)
        p = 9
    # Only the car of the chicken's row (car p - 1) can reach it; it does before or after it moves.
    lane = min(max(p - 1, 0), _N_CARS - 1)
    hit = car_x[i, lane] == 4
    for k in range(_N_CARS):
        speed = car_speed[i, k]
        if car_timer[i, k] == 0:
            car_timer[i, k] = abs(speed)
            car_x[i, k] = _wrap(car_x[i, k] + (1 if speed > 0 else -1))
        else:
            car_timer[i, k] -= 1
    if 1 <= p <= _N_CARS and (hit or car_x[i, lane] == 4):
        p = 9
    pos[i] = p
    move_timer[i] = timer - 1 if timer > 0 else timer
    left = terminate_timer[i] - 1
    terminate_timer[i] = left
    return 1.0 if win else 0.0, left < 0


@_jit
def observe(s, i, frame):
    """Row ``i``'s frame into ``frame`` (``bool [10, 10, 7]``), cleared first."""
    pos, move_timer, terminate_timer, car_x, car_timer, car_speed = s
    frame[:] = False
    frame[pos[i], 4, 0] = True
    for k in range(_N_CARS):
        x, speed = car_x[i, k], car_speed[i, k]
        frame[k + 1, x, 1] = True
        if speed != 0:  # the trail's channel is speed1 ... speed5 for |speed| 1 ... 5
            frame[k + 1, _wrap(x - (1 if speed > 0 else -1)), 1 + abs(speed)] = True
