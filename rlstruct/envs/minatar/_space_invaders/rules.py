"""MinAtar SpaceInvaders, written once for both steps: :data:`GAME` (batched, torch) and, compiled from these very
functions, the compiled CPU step's (:mod:`rlstruct.envs.minatar._scalar`).

The state is a flat dict of ``[n, ...]`` tensors under the reference's attribute names: the cannon's column
``pos``; the aliens and both kinds of bullets as maps ``int32 [n, 10]``, one bit mask per row (bit ``c`` of row
``r`` is cell ``(r, c)``, so a move is a shift of ten numbers, not of a hundred cells); the aliens' direction
(``-1`` left, ``+1`` right) and the timers. The game draws no random numbers: ``n_step_draws`` and
``n_reset_draws`` are 0. With ramping, each new wave moves faster.

>>> import torch
>>> state = GAME.reset(torch.rand(2, 0, dtype=torch.float64), ramping=True)
>>> state, reward, terminated = GAME.step(state, torch.tensor([5, 1]), torch.rand(2, 0, dtype=torch.float64),
...                                       ramping=True)
>>> GAME.observe(state).shape, state["pos"].tolist(), reward.tolist()
(torch.Size([2, 10, 10, 6]), [5, 4], [0.0, 0.0])
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

from rlstruct.envs.minatar._batched import (
    RulesGame,
    bit_planes,
    clamp,
    each,
    each_if,
    each_mark,
    each_sum,
    fill,
    frame,
    full_row,
    last_with_bit,
    minimum,
    move_down,
    move_up,
    nearest_bit,
    or_all,
    or_slot,
    slot,
    to_float,
    where,
)

__all__ = ["GAME", "to_rows", "to_cells"]

NAME = "space_invaders"
CHANNELS = ("cannon", "alien", "alien_left", "alien_right", "friendly_bullet", "enemy_bullet")
N_STEP_DRAWS = 0
N_RESET_DRAWS = 0
STATE_KEYS = ("pos", "f_bullet_map", "e_bullet_map", "alien_map", "alien_dir", "enemy_move_interval",
              "alien_move_timer", "alien_shot_timer", "ramp_index", "shot_timer")
ROWS = ("f_bullet_map", "e_bullet_map", "alien_map")

SHOT_COOL_DOWN = 5
ENEMY_MOVE_INTERVAL = 12
ENEMY_SHOT_INTERVAL = 10
# A new wave never moves faster than this.
FASTEST_MOVE_INTERVAL = 6
# A wave fills rows 0-3, columns 2-7.
WAVE_ROW = 0b0011111100


def to_rows(cells: Tensor) -> Tensor:
    """``int32 [..., 10]`` row masks of the map ``cells`` (``[..., 10, 10]``, nonzero where set)."""
    weights = 2 ** torch.arange(10, device=cells.device, dtype=torch.int32)
    return ((cells != 0).to(torch.int32) * weights).sum(-1, dtype=torch.int32)


def to_cells(rows: Tensor) -> Tensor:
    """``bool [..., 10, 10]``: the cells of the row masks ``rows`` (``int32 [..., 10]``)."""
    return (rows[..., None] >> torch.arange(10, device=rows.device, dtype=torch.int32)) & 1 != 0


def _popcount(x):
    """The set bits of a 10-bit row (the classic parallel bit count)."""
    x = x - ((x >> 1) & 0x155)
    x = (x & 0x333) + ((x >> 2) & 0x333)
    x = (x + (x >> 4)) & 0xF0F
    return (x & 0xFF) + (x >> 8)


def _bit(bits, c):
    """Whether bit ``c`` of ``bits`` is set."""
    return (bits >> c) & 1 != 0


def _new_wave(k, aliens):
    """Row ``k`` with a new wave's aliens added (rows 0-3)."""
    return (where(k < 4, aliens | WAVE_ROW, aliens),)


def _aliens_in(k, aliens):
    return (_popcount(aliens),)


def _sideways(k, aliens, direction):
    return (where(direction > 0, aliens << 1, aliens >> 1),)


def _hits(k, aliens, friendly):
    """Row ``k`` after the friendly bullets hit: ``(aliens, friendly, aliens killed, whether aliens are left)``."""
    kill = aliens & friendly
    aliens = aliens & ~kill
    return aliens, friendly & ~kill, _popcount(kill), aliens != 0


def reset(u, ramping, f_bullet_map, e_bullet_map, alien_map):
    """The cannon in column 5 under a full wave moving left (``u`` holds no draws): the state, in
    :data:`STATE_KEYS` order."""
    (alien_map,) = each(_new_wave, (full_row(alien_map, u, 10, 0, int32=True),), (), ())
    return (fill(u, 5, int32=True), full_row(f_bullet_map, u, 10, 0, int32=True),
            full_row(e_bullet_map, u, 10, 0, int32=True), alien_map, fill(u, -1, int32=True),
            fill(u, ENEMY_MOVE_INTERVAL, int32=True), fill(u, ENEMY_MOVE_INTERVAL, int32=True),
            fill(u, ENEMY_SHOT_INTERVAL, int32=True), fill(u, 0, int32=True), fill(u, 0, int32=True))


def step(pos, f_bullet_map, e_bullet_map, alien_map, alien_dir, enemy_move_interval, alien_move_timer,
         alien_shot_timer, ramp_index, shot_timer, action, u, ramping):
    """One step, the reference's ``act`` in the same order of updates (``action`` in the full set: 0 noop, 1 left,
    3 right, 5 fire; 2 and 4 do nothing): ``(state, reward, terminated)``."""
    fire = (action == 5) & (shot_timer == 0)
    shot = where(fire, 1 << pos, 0)
    shot_timer = where(fire, SHOT_COOL_DOWN, shot_timer)
    pos = where(action == 1, clamp(pos - 1, 0, 9), where(action == 3, clamp(pos + 1, 0, 9), pos))

    # Bullets move a row (friendly up, the new shot from row 9 to 8; enemy down); those leaving are dropped.
    friendly = move_up(or_slot(f_bullet_map, 9, shot, True), 0, True)
    enemy = move_down(e_bullet_map, 0, True)
    terminal = _bit(slot(enemy, 9), pos)

    aliens, direction = alien_map, alien_dir
    terminal = terminal | _bit(slot(aliens, 9), pos)
    moves = alien_move_timer == 0
    _, (count,) = each_sum(_aliens_in, (), (aliens,), (), 1)
    timer = where(moves, minimum(count, enemy_move_interval), alien_move_timer)
    anywhere = or_all(aliens)
    at_edge = (_bit(anywhere, 0) & (direction < 0)) | (_bit(anywhere, 9) & (direction > 0))
    down = moves & at_edge
    sideways = moves & ~at_edge
    terminal = terminal | (down & (slot(aliens, 9) != 0))
    # np.roll wraps: a wave already on the bottom row comes back on top (the game is over by then). Sideways
    # nothing wraps: a wave at the edge it moves to goes down instead.
    aliens = move_down(aliens, slot(aliens, 9), down)
    (aliens,) = each_if(sideways, _sideways, (aliens,), (), (direction,))
    anywhere = where(sideways, where(direction > 0, anywhere << 1, anywhere >> 1), anywhere)
    alien_dir = where(down, -direction, direction)
    terminal = terminal | (moves & _bit(slot(aliens, 9), pos))

    # The alien nearest the cannon fires: the nearest column holding one (the left one of two at the same
    # distance), its lowest alien.
    shoots = alien_shot_timer == 0
    column = nearest_bit(anywhere, pos)
    enemy = or_slot(enemy, last_with_bit(aliens, column), 1 << column, shoots & (anywhere != 0))

    (aliens, friendly), (killed, left) = each_sum(_hits, (aliens, friendly), (), (), 2)
    cleared = left == 0
    shot_timer = where(shot_timer > 0, shot_timer - 1, shot_timer)
    alien_move_timer = timer - 1
    alien_shot_timer = where(shoots, ENEMY_SHOT_INTERVAL, alien_shot_timer) - 1
    if ramping:
        faster = cleared & (enemy_move_interval > FASTEST_MOVE_INTERVAL)
        enemy_move_interval = where(faster, enemy_move_interval - 1, enemy_move_interval)
        ramp_index = where(faster, ramp_index + 1, ramp_index)
    (aliens,) = each_if(cleared, _new_wave, (aliens,), (), ())
    return ((pos, friendly, enemy, aliens, alien_dir, enemy_move_interval, alien_move_timer, alien_shot_timer,
             ramp_index, shot_timer), to_float(killed), terminal)


def _row_cells(f, k, aliens, friendly, enemy, left):
    """Row ``k`` of channels 1-5: the aliens (and again as moving left or right) and both kinds of bullets."""
    return bit_planes(f, 1, k, (aliens, aliens, aliens, friendly, enemy), (True, left, ~left, True, True))


def observe(pos, f_bullet_map, e_bullet_map, alien_map, alien_dir, enemy_move_interval, alien_move_timer,
            alien_shot_timer, ramp_index, shot_timer, storage):
    """The reference's ``state()`` frame, its channels :data:`CHANNELS`."""
    f = frame(storage, pos, 6, 0, 9, pos)
    return each_mark(f, _row_cells, (alien_map, f_bullet_map, e_bullet_map), (alien_dir < 0,))


GAME = RulesGame(sys.modules[__name__])
