"""MinAtar Asterix, written once for both steps: :data:`GAME` (batched, torch) and, compiled from these very
functions, the compiled CPU step's (:mod:`rlstruct.envs.minatar._scalar`).

The player moves in the four directions over rows 1-8; enemies and gold spawn at either side, one per row at most
(slot ``i`` is row ``i + 1``), and cross the screen. Picking up gold gives +1; touching an enemy ends the episode.
With ramping, every 100 steps the spawn interval (and every other time the move interval) shrinks.

Draws: none per reset, 3 per step, minatar's ``_spawn_entity`` when the spawn timer is up: ``u[:, 0]`` is the side
(``rand() < 1/2``: from the left, moving right), ``u[:, 1]`` gold or enemy (``rand() < 1/3``: gold), ``u[:, 2]``
the slot (``randint(k)`` over the ``k`` free slots in order: the ``floor(k u)``-th; not drawn when none is free).

State (``[B]`` unless said): ``player_x``, ``player_y``, ``spawn_speed``, ``spawn_timer``, ``move_speed``,
``move_timer``, ``ramp_timer``, ``ramp_index``; per slot (``[B, 8]``) ``alive``, ``x``, ``right`` (moving right),
``gold``.

>>> import torch
>>> s = GAME.reset(torch.zeros(2, 0, dtype=torch.float64), True)
>>> s["player_x"].tolist(), s["spawn_timer"].tolist()
([5, 5], [10, 10])
>>> u = torch.tensor([[0.1, 0.1, 0.0], [0.9, 0.9, 0.99]], dtype=torch.float64)
>>> s, reward, terminated = GAME.step(s, torch.tensor([1, 2]), u, True)
>>> s["player_x"].tolist(), s["player_y"].tolist(), GAME.observe(s).shape
([4, 5], [5, 4], torch.Size([2, 10, 10, 4]))
"""

from __future__ import annotations

import sys

from rlstruct.envs.minatar._batched import (
    RulesGame,
    clamp,
    count,
    draw,
    each_mark,
    each_sum,
    fill,
    floor_int,
    frame,
    full_row,
    mark_if,
    nth,
    to_float,
    to_int,
    where,
)

__all__ = ["GAME"]

NAME = "asterix"
CHANNELS = ("player", "enemy", "trail", "gold")
N_STEP_DRAWS = 3
N_RESET_DRAWS = 0
STATE_KEYS = ("player_x", "player_y", "spawn_speed", "spawn_timer", "move_speed", "move_timer", "ramp_timer",
              "ramp_index", "alive", "x", "right", "gold")
ROWS = ("alive", "x", "right", "gold")

RAMP_INTERVAL = 100
INIT_SPAWN_SPEED = 10
INIT_MOVE_INTERVAL = 5
N_SLOTS = 8


def reset(u, ramping, alive, x, right, gold):
    """A new game (``u`` holds no draws): the state, in :data:`STATE_KEYS` order."""
    return (fill(u, 5), fill(u, 5), fill(u, INIT_SPAWN_SPEED), fill(u, INIT_SPAWN_SPEED), fill(u, INIT_MOVE_INTERVAL),
            fill(u, INIT_MOVE_INTERVAL), fill(u, RAMP_INTERVAL), fill(u, 0), full_row(alive, u, N_SLOTS, False),
            full_row(x, u, N_SLOTS, 0), full_row(right, u, N_SLOTS, False), full_row(gold, u, N_SLOTS, False))


def _slot_step(k, alive, x, right, gold, spawn_at, from_left, is_gold, row, col, moves):
    """Slot ``k`` (row ``k + 1``) in a step: ``(alive, x, right, gold, picked, lost)``, ``picked`` the gold the
    player picks up there, ``lost`` whether an enemy touches the player there."""
    new = k == spawn_at
    alive = alive | new
    x = where(new, where(from_left, 0, 9), x)
    right = where(new, from_left, right)
    gold = where(new, is_gold, gold)
    # Contact before the entity moves, then after (when it moves this step).
    touch = alive & (k + 1 == row) & (x == col)
    picked = touch & gold
    lost = touch & ~gold
    alive = alive & ~picked
    x = where(moves & alive, x + where(right, 1, -1), x)
    alive = alive & (x >= 0) & (x <= 9)
    touch = moves & alive & (k + 1 == row) & (x == col)
    alive = alive & ~(touch & gold)
    return alive, x, right, gold, picked | (touch & gold), lost | (touch & ~gold)


def step(player_x, player_y, spawn_speed, spawn_timer, move_speed, move_timer, ramp_timer, ramp_index, alive, x,
         right, gold, action, u, ramping):
    """One step with the full-set action ``action`` and the draws ``u`` (3): ``(state, reward, terminated)``."""
    # Spawn: the floor(k u)-th free slot, k the free slots.
    spawn = spawn_timer == 0
    rank = floor_int(draw(u, 2) * count(alive, False))
    spawn_at = where(spawn, nth(alive, False, rank), N_SLOTS)
    spawn_timer = where(spawn, spawn_speed, spawn_timer)
    px = where(action == 1, clamp(player_x - 1, 0, 9), where(action == 3, clamp(player_x + 1, 0, 9), player_x))
    py = where(action == 2, clamp(player_y - 1, 1, 8), where(action == 4, clamp(player_y + 1, 1, 8), player_y))
    moves = move_timer == 0
    move_timer = where(moves, move_speed, move_timer)
    (alive, x, right, gold), (reward, lost) = each_sum(
        _slot_step, (alive, x, right, gold), (), (spawn_at, draw(u, 0) < 0.5, draw(u, 1) < 1 / 3, py, px, moves), 2)
    spawn_timer = spawn_timer - 1
    move_timer = move_timer - 1
    if ramping:
        ramps = (spawn_speed > 1) | (move_speed > 1)
        bump = ramps & (ramp_timer < 0)
        move_speed = move_speed - to_int(bump & (move_speed > 1) & ((ramp_index & 1) == 1))
        spawn_speed = spawn_speed - to_int(bump & (spawn_speed > 1))
        ramp_index = ramp_index + to_int(bump)
        ramp_timer = where(bump, RAMP_INTERVAL, ramp_timer - to_int(ramps))
    return ((px, py, spawn_speed, spawn_timer, move_speed, move_timer, ramp_timer, ramp_index, alive, x, right, gold),
            to_float(reward), lost > 0)


def _slot_cells(f, k, alive, x, right, gold):
    """Slot ``k``'s entity (an enemy or gold) and its trail."""
    f = mark_if(f, 1, k + 1, x, alive & ~gold)
    f = mark_if(f, 3, k + 1, x, alive & gold)
    back = x - where(right, 1, -1)
    return mark_if(f, 2, k + 1, back, alive & (back >= 0) & (back <= 9))


def observe(player_x, player_y, spawn_speed, spawn_timer, move_speed, move_timer, ramp_timer, ramp_index, alive, x,
            right, gold, storage):
    """The frame (minatar's ``state()``), its channels :data:`CHANNELS`."""
    f = frame(storage, player_x, 4, 0, player_y, player_x)
    return each_mark(f, _slot_cells, (alive, x, right, gold), ())


GAME = RulesGame(sys.modules[__name__])
