"""MinAtar Breakout, written once for both steps: :data:`GAME` (batched, torch) and, compiled from these very
functions, the compiled CPU step's (:mod:`rlstruct.envs.minatar._scalar`).

A paddle on the bottom row bounces a ball that travels along diagonals and breaks the three rows of bricks at the
top (+1 a brick; a new wall when the ball reaches the bottom row with every brick gone); the episode ends when the
ball reaches the bottom row beside the paddle. Draws: one per reset (minatar's ``randint(2)``, the ball's start:
left going down-right, or right going down-left), none per step.

State (``[B]`` unless said): ``ball_x``, ``ball_y``, ``ball_dir`` (``0`` up-left, ``1`` up-right, ``2``
down-right, ``3`` down-left), ``pos`` (the paddle's column), ``last_x``, ``last_y`` (the ball's previous cell, the
trail), ``strike`` (bool: the ball hit a brick at the previous step), ``bricks`` (``bool [B, 10, 10]``).
``ramping`` has no effect (Breakout does not ramp).

>>> import torch
>>> u = torch.tensor([[0.2], [0.7]], dtype=torch.float64)
>>> s = GAME.reset(u, True)
>>> s["ball_x"].tolist(), s["ball_dir"].tolist()
([0, 9], [2, 3])
>>> s, reward, terminated = GAME.step(s, torch.tensor([3, 1]), u[:, :0], True)
>>> s["ball_x"].tolist(), s["ball_y"].tolist(), s["pos"].tolist(), GAME.observe(s).shape
([1, 8], [4, 4], [5, 3], torch.Size([2, 10, 10, 4]))
"""

from __future__ import annotations

import sys

from rlstruct.envs.minatar._batched import (
    RulesGame,
    cell,
    clamp,
    draw,
    fill,
    fill_rows_if_empty,
    floor_int,
    frame,
    mark,
    plane,
    put,
    rows_grid,
    to_float,
    where,
)

__all__ = ["GAME"]

NAME = "breakout"
CHANNELS = ("paddle", "ball", "trail", "brick")
N_STEP_DRAWS = 0
N_RESET_DRAWS = 1
STATE_KEYS = ("ball_x", "ball_y", "ball_dir", "pos", "last_x", "last_y", "strike", "bricks")
ROWS = ("bricks",)

# Directions 0-3 are up-left, up-right, down-right, down-left: a bounce off a side wall is ``d ^ 1`` (minatar's
# [1, 0, 3, 2]), off the top, a brick or the paddle's middle ``3 - d`` ([3, 2, 1, 0]), off the paddle's edge
# ``d ^ 2`` ([2, 3, 0, 1]). Arithmetic, not lookup tables: no constant tensor to keep per device.


def reset(u, ramping, bricks):
    """A new game from the draw ``u``'s first column: the state, in :data:`STATE_KEYS` order."""
    right = floor_int(draw(u, 0) * 2) == 1
    ball_x = where(right, 9, 0)
    ball_y = fill(u, 3)
    return (ball_x, ball_y, where(right, 3, 2), fill(u, 4), ball_x, ball_y, fill(u, False),
            rows_grid(bricks, u, 1, 4))


def step(ball_x, ball_y, ball_dir, pos, last_x, last_y, strike, bricks, action, u, ramping):
    """One step with the full-set action ``action``: ``(state, reward, terminated)``."""
    pos = where(action == 1, clamp(pos - 1, 0, 9), pos)
    pos = where(action == 3, clamp(pos + 1, 0, 9), pos)
    d = ball_dir
    new_x = ball_x + where((d == 1) | (d == 2), 1, -1)
    new_y = ball_y + where(d <= 1, -1, 1)
    side = (new_x < 0) | (new_x > 9)
    new_x = clamp(new_x, 0, 9)
    d = where(side, d ^ 1, d)
    top = new_y < 0
    new_y = where(top, 0, new_y)
    d = where(top, 3 - d, d)
    there = cell(bricks, new_y, new_x)
    brick = ~top & there
    broken = brick & ~strike
    bricks = put(bricks, new_y, new_x, there & ~broken)
    new_y = where(broken, ball_y, new_y)
    d = where(broken, 3 - d, d)
    bottom = ~top & ~brick & (new_y == 9)
    bricks = fill_rows_if_empty(bricks, 1, 4, bottom)
    centre = bottom & (ball_x == pos)
    corner = bottom & ~centre & (new_x == pos)
    d = where(centre, 3 - d, where(corner, d ^ 2, d))
    new_y = where(centre | corner, ball_y, new_y)
    terminated = bottom & ~centre & ~corner
    return (new_x, new_y, d, pos, ball_x, ball_y, brick, bricks), to_float(broken), terminated


def observe(ball_x, ball_y, ball_dir, pos, last_x, last_y, strike, bricks, storage):
    """The frame (minatar's ``state()``), its channels :data:`CHANNELS`."""
    f = frame(storage, pos, 4, 0, 9, pos)
    f = mark(f, 1, ball_y, ball_x)
    f = mark(f, 2, last_y, last_x)
    return plane(f, 3, bricks)


GAME = RulesGame(sys.modules[__name__])
