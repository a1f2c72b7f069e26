"""MinAtar Freeway, written once for both steps: :data:`GAME` (batched, torch) and, compiled from these very
functions, the compiled CPU step's (:mod:`rlstruct.envs.minatar._scalar`).

A chicken crosses eight lanes of traffic from the bottom row to the top (+1, then back to the bottom and new car
speeds); it moves up or down at most every third step, and a car that reaches it sends it back to the bottom. Cars
wrap around the screen, car ``i`` in row ``i + 1``, each moving one cell every ``|speed|`` + 1 steps in the
direction of the speed's sign. The game ends after 2500 steps (the gymnasium ids truncate at 1000 first).

Draws: 16 per reset and 16 per step, minatar's ``_randomize_cars``: ``u[:, :8]`` are ``randint(1, 6, 8)`` (the
speeds, ``1 + floor(5 u)``), ``u[:, 8:]`` are ``rand(8)`` (the directions, ``sign(u - 1/2)``). A step uses them when
the chicken reaches the top.

State (``[B]`` unless said): ``pos`` (the chicken's row, in column 4), ``move_timer``, ``terminate_timer``,
``car_x``, ``car_timer``, ``car_speed`` (``int64 [B, 8]``, the speed signed by the direction). ``ramping`` has no
effect (Freeway does not ramp).

>>> import torch
>>> u = torch.full((1, 16), 0.9, dtype=torch.float64)
>>> s = GAME.reset(u, True)
>>> s["car_speed"].tolist(), s["pos"].tolist()
([[5, 5, 5, 5, 5, 5, 5, 5]], [9])
>>> s, reward, terminated = GAME.step(s, torch.tensor([2]), u, True)
>>> s["car_timer"].tolist(), GAME.observe(s).shape
([[4, 4, 4, 4, 4, 4, 4, 4]], torch.Size([1, 10, 10, 7]))
"""

from __future__ import annotations

import sys

from rlstruct.envs.minatar._batched import (
    RulesGame,
    clamp,
    draws,
    each,
    each_if,
    each_mark,
    fill,
    floor_int,
    frame,
    full_row,
    mark,
    mark_if,
    sign,
    slot,
    to_float,
    to_int,
    where,
)

__all__ = ["GAME"]

NAME = "freeway"
CHANNELS = ("chicken", "car", "speed1", "speed2", "speed3", "speed4", "speed5")
N_STEP_DRAWS = 16
N_RESET_DRAWS = 16
STATE_KEYS = ("pos", "move_timer", "terminate_timer", "car_x", "car_timer", "car_speed")
ROWS = ("car_x", "car_timer", "car_speed")

PLAYER_SPEED = 3
TIME_LIMIT = 2500
N_CARS = 8


def _new_car(k, timer, speed, u_speed, u_direction):
    """One car's ``(timer, speed)`` from minatar's ``_randomize_cars`` draws (its old ones ignored)."""
    speed = (1 + floor_int(u_speed * 5)) * sign(u_direction - 0.5)
    return abs(speed), speed


def _car_draws(u):
    """The draws of :func:`_new_car`, one of each per car."""
    return draws(u, 0, N_CARS), draws(u, N_CARS, N_CARS)


def _wrap(x):
    return where(x < 0, 9, where(x > 9, 0, x))


def _move_car(k, x, timer, speed):
    """One car's ``(x, timer, speed)`` after a step."""
    moves = timer == 0
    new_timer = where(moves, abs(speed), timer - 1)
    x = _wrap(where(moves, x + where(speed > 0, 1, -1), x))
    return x, new_timer, speed


def reset(u, ramping, car_x, car_timer, car_speed):
    """A new game from the draws ``u`` (16): the state, in :data:`STATE_KEYS` order."""
    car_timer, car_speed = each(_new_car, (car_timer, car_speed), _car_draws(u), ())
    return (fill(u, 9), fill(u, PLAYER_SPEED), fill(u, TIME_LIMIT), full_row(car_x, u, N_CARS, 0), car_timer,
            car_speed)


def step(pos, move_timer, terminate_timer, car_x, car_timer, car_speed, action, u, ramping):
    """One step with the full-set action ``action`` and the draws ``u`` (16): ``(state, reward, terminated)``."""
    ready = move_timer == 0
    up = (action == 2) & ready
    down = (action == 4) & ready
    move_timer = where(up | down, PLAYER_SPEED, move_timer)
    pos = where(up, clamp(pos - 1, 0, 9), where(down, clamp(pos + 1, 0, 9), pos))
    win = pos == 0
    car_timer, car_speed = each_if(win, _new_car, (car_timer, car_speed), _car_draws(u), ())
    pos = where(win, 9, pos)
    # Only the car of the chicken's row (car pos - 1) can reach it; it does before or after it moves.
    lane = pos - 1
    on_road = (lane >= 0) & (lane < N_CARS)
    lane = clamp(lane, 0, N_CARS - 1)
    hit = slot(car_x, lane) == 4
    car_x, car_timer, car_speed = each(_move_car, (car_x, car_timer, car_speed), (), ())
    hit = on_road & (hit | (slot(car_x, lane) == 4))
    pos = where(hit, 9, pos)
    move_timer = move_timer - to_int(move_timer > 0)
    terminate_timer = terminate_timer - 1
    return ((pos, move_timer, terminate_timer, car_x, car_timer, car_speed), to_float(win),
            terminate_timer < 0)


def _car_cells(f, k, x, speed):
    """Car ``k``'s cell and its trail, whose channel is speed1 ... speed5 for ``|speed|`` 1 ... 5 (none for 0)."""
    f = mark(f, 1, k + 1, x)
    return mark_if(f, 1 + abs(speed), k + 1, _wrap(x - where(speed > 0, 1, -1)), speed != 0)


def observe(pos, move_timer, terminate_timer, car_x, car_timer, car_speed, storage):
    """The frame (minatar's ``state()``), its channels :data:`CHANNELS`."""
    f = frame(storage, pos, 7, 0, pos, 4)
    return each_mark(f, _car_cells, (car_x, car_speed), ())


GAME = RulesGame(sys.modules[__name__])
