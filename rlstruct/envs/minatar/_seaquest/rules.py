"""MinAtar Seaquest, written once for both steps: :data:`GAME` (batched, torch) and, compiled from these very
functions, the compiled CPU step's (:mod:`rlstruct.envs.minatar._scalar`).

The state is a flat dict of ``[n, ...]`` tensors: the player's numbers under the reference's attribute names; the
fish and enemy subs in ``MAX_ENEMIES`` slots (``enemy_*``), a spawn taking the first free one; the friendly bullets
and the divers in ``MAX_BULLETS`` and ``MAX_DIVERS`` slots (``bullet_*``, ``diver_*``), oldest first, the live ones
a prefix; the enemy bullets as two rows of 100 cells (slot ``10 y + x``), one per direction (they meet nothing but
the player, so bullets sharing a cell act as one). Integers are ``int64`` (the enemies' spawn numbers grow with the
episode), flags ``bool``.

Draws: a step reads 5 uniforms, in the reference's call order: when the enemy spawn timer is 0, ``u[:, 0:3]`` spawn
an enemy (``rand() < 1/2``: moving right, ``rand() < 1/3``: a sub, ``randint(1, 9)``: the row); when the diver
spawn timer is 0, the next two spawn a diver (direction, row): ``u[:, 3:5]`` after an enemy spawn, ``u[:, 0:2]``
without one. A reset reads none.

>>> import torch
>>> state = GAME.reset(torch.rand(2, GAME.n_reset_draws, dtype=torch.float64), ramping=True)
>>> action = torch.tensor([4, 5])
>>> state, reward, terminated = GAME.step(state, action, torch.rand(2, GAME.n_step_draws, dtype=torch.float64),
...                                       ramping=True)
>>> GAME.observe(state).shape, reward.tolist(), terminated.tolist()
(torch.Size([2, 10, 10, 10]), [0.0, 0.0], [False, False])
"""

from __future__ import annotations

import sys

from rlstruct.envs.minatar._batched import (
    RulesGame,
    bar,
    clamp,
    draw,
    each,
    each_mark,
    each_mark_if,
    each_max,
    each_min,
    fill,
    floor_int,
    frame,
    full_row,
    mark,
    mark_if,
    minimum,
    plane_rows,
    set_slot_if,
    shift_cells,
    slot,
    to_float,
    to_int,
    where,
)

__all__ = ["GAME", "MAX_ENEMIES", "MAX_BULLETS", "MAX_DIVERS"]

NAME = "seaquest"
CHANNELS = ("sub_front", "sub_back", "friendly_bullet", "trail", "enemy_bullet", "enemy_fish", "enemy_sub",
            "oxygen_guage", "diver_guage", "diver")
N_STEP_DRAWS = 5
N_RESET_DRAWS = 0
_SCALARS = ("oxygen", "diver_count", "sub_x", "sub_y", "shot_timer", "e_spawn_speed", "e_spawn_timer",
            "d_spawn_timer", "move_speed", "ramp_index", "n_spawned", "sub_or", "surface")
ROWS = ("enemy_x", "enemy_y", "enemy_move", "enemy_shot", "enemy_birth", "enemy_alive", "enemy_lr", "enemy_sub",
        "bullet_x", "bullet_y", "bullet_alive", "bullet_lr", "diver_x", "diver_y", "diver_move", "diver_alive",
        "diver_lr", "enemy_bullets_left", "enemy_bullets_right")
STATE_KEYS = _SCALARS + ROWS

MAX_OXYGEN = 200
INIT_SPAWN_SPEED = 20
DIVER_SPAWN_SPEED = 30
INIT_MOVE_INTERVAL = 5
SHOT_COOL_DOWN = 5
ENEMY_SHOT_INTERVAL = 10
DIVER_MOVE_INTERVAL = 5
MAX_DIVERS_HELD = 6
# At most one enemy spawns a step. Born at move interval 2, an enemy lives at most 30 steps; born earlier, at
# spawn intervals of 15 or more, at most 4 of those are still alive: 34 at most, rounded up.
MAX_ENEMIES = 40
# One shot every 5 steps, each gone within 9 steps; one diver every 30 steps, each gone within 60 steps. The rules
# read and write these two groups' slots one by one.
MAX_BULLETS = 2
MAX_DIVERS = 2
# An enemy's rank among those in one cell: subs after fish, then by spawn number (each enemy's its own).
_SUB_RANK = 2**30
_NO_KEY = 2**31 - 1


def reset(u, ramping, enemy_x, enemy_y, enemy_move, enemy_shot, enemy_birth, enemy_alive, enemy_lr, enemy_sub,
          bullet_x, bullet_y, bullet_alive, bullet_lr, diver_x, diver_y, diver_move, diver_alive, diver_lr,
          enemy_bullets_left, enemy_bullets_right):
    """The sub at the surface, full oxygen, nothing else (``u`` holds no draws): the state, in :data:`STATE_KEYS`
    order."""
    return (fill(u, MAX_OXYGEN), fill(u, 0), fill(u, 5), fill(u, 0), fill(u, 0), fill(u, INIT_SPAWN_SPEED),
            fill(u, INIT_SPAWN_SPEED), fill(u, DIVER_SPAWN_SPEED), fill(u, INIT_MOVE_INTERVAL), fill(u, 0),
            fill(u, 0), fill(u, False), fill(u, True),
            full_row(enemy_x, u, MAX_ENEMIES, 0), full_row(enemy_y, u, MAX_ENEMIES, 0),
            full_row(enemy_move, u, MAX_ENEMIES, 0), full_row(enemy_shot, u, MAX_ENEMIES, 0),
            full_row(enemy_birth, u, MAX_ENEMIES, 0), full_row(enemy_alive, u, MAX_ENEMIES, False),
            full_row(enemy_lr, u, MAX_ENEMIES, False), full_row(enemy_sub, u, MAX_ENEMIES, False),
            full_row(bullet_x, u, MAX_BULLETS, 0), full_row(bullet_y, u, MAX_BULLETS, 0),
            full_row(bullet_alive, u, MAX_BULLETS, False), full_row(bullet_lr, u, MAX_BULLETS, False),
            full_row(diver_x, u, MAX_DIVERS, 0), full_row(diver_y, u, MAX_DIVERS, 0),
            full_row(diver_move, u, MAX_DIVERS, 0), full_row(diver_alive, u, MAX_DIVERS, False),
            full_row(diver_lr, u, MAX_DIVERS, False), full_row(enemy_bullets_left, u, 100, False),
            full_row(enemy_bullets_right, u, 100, False))


def _step_x(lr):
    """``+1`` moving right, ``-1`` moving left."""
    return where(lr, 1, -1)


def _edge_x(lr):
    """Where a spawn enters: column 0 moving right, 9 moving left."""
    return where(lr, 0, 9)


def _key(sub, birth):
    return where(sub, _SUB_RANK, 0) + birth


def _survey(k, alive, x, y, lr, sub, birth, row, new_lr, c0, c1):
    """Enemy ``k`` before the spawn: ``0`` if it is in ``row`` going the other way (no enemy spawns there), else
    ``1``; ``k`` if its slot is free, else ``MAX_ENEMIES``; its rank key where each friendly bullet (in cell ``c0``,
    ``c1``: ``10 y + x``, ``-1`` for none) meets it, else ``_NO_KEY``."""
    key = _key(sub, birth)
    cell = where(alive, y * 10 + x, -2)
    return (where(alive & (y == row) & (lr != new_lr), 0, 1), where(alive, MAX_ENEMIES, k),
            where(cell == c0, key, _NO_KEY), where(cell == c1, key, _NO_KEY))


def _move_enemy(k, x, y, move, shot, birth, alive, lr, sub, at, new_x, row, new_lr, is_sub, n_spawned, best0, best1,
                live0, live1, sub_x, sub_y, move_speed):
    """Enemy ``k`` after the spawn into slot ``at`` (none where ``at`` is ``-1``); it dies if a friendly bullet picked
    it (a bullet picked its key, ``best0`` or ``best1``), moves, and its timers run: ``(x, y, move,
    shot, birth, alive, lr, sub, player hit, whether it shoots, key where it moved into the cell of a bullet still
    flying (``live0``, ``live1``; ``-1`` where not))``."""
    new = k == at
    x, y, move = where(new, new_x, x), where(new, row, y), where(new, move_speed, move)
    shot, birth, alive = where(new, ENEMY_SHOT_INTERVAL, shot), where(new, n_spawned, birth), alive | new
    lr, sub = where(new, new_lr, lr), where(new, is_sub, sub)
    key = _key(sub, birth)
    # A bullet's pick is the enemy of that key: each enemy's is its own (its spawn number).
    alive = alive & (key != best0) & (key != best1)
    hit = alive & (x == sub_x) & (y == sub_y)
    moves = alive & (move == 0)
    x = where(moves, x + _step_x(lr), x)
    out = moves & ((x < 0) | (x > 9))
    on_player = moves & ~out & (x == sub_x) & (y == sub_y)
    shot = where(sub, where(shot == 0, ENEMY_SHOT_INTERVAL, shot - 1), shot)
    move = where(moves, move_speed, move - 1)
    alive = alive & ~out
    landed = moves & ~out & ~on_player
    cell = where(landed, y * 10 + x, -2)
    first, second = where(cell == live0, key, -1), where(cell == live1, key, -1)
    shoots = alive & sub & (shot == ENEMY_SHOT_INTERVAL)
    return x, y, move, shot, birth, alive, lr, sub, to_int(hit | on_player), to_int(shoots), first, second


def _fire(f, k, alive, sub, shot, lr, y, x):
    """Enemy ``k``'s shot into the enemy bullet rows ``f`` (left, right): a sub alive whose timer was 0 (it just
    restarted)."""
    shoots = alive & sub & (shot == ENEMY_SHOT_INTERVAL)
    cell = y * 10 + x
    return set_slot_if(f[0], cell, shoots & ~lr), set_slot_if(f[1], cell, shoots & lr)


def _die_landed(k, alive, sub, birth, best0, best1):
    """Enemy ``k`` dies if a friendly bullet picked it after its move."""
    key = _key(sub, birth)
    return (alive & (key != best0) & (key != best1),)


def _pair(k, x, y, alive, lr, x0, x1, y0, y1, alive0, alive1, lr0, lr1):
    """Slot ``k`` of a two-slot group: the values given for slot 0 or slot 1."""
    first = k == 0
    return where(first, x0, x1), where(first, y0, y1), where(first, alive0, alive1), where(first, lr0, lr1)


def _choose(k, value, value0, value1):
    """Slot ``k`` of a two-slot row: ``value0`` or ``value1``."""
    return (where(k == 0, value0, value1),)


def _diver(x, y, move, alive, lr, sub_x, sub_y, count):
    """A diver moves; in the sub's cell (before or after its move) it boards it while it holds fewer than 6:
    ``(x, move, alive, count)``."""
    moves = move == 0
    new_x = where(moves, x + _step_x(lr), x)
    inside = (new_x >= 0) & (new_x <= 9)
    boards = alive & (y == sub_y) & ((x == sub_x) | (moves & inside & (new_x == sub_x))) & (count < MAX_DIVERS_HELD)
    return new_x, where(moves, DIVER_MOVE_INTERVAL, move - 1), alive & inside & ~boards, count + to_int(boards)


def step(oxygen, diver_count, sub_x, sub_y, shot_timer, e_spawn_speed, e_spawn_timer, d_spawn_timer, move_speed,
         ramp_index, n_spawned, sub_or, surface, enemy_x, enemy_y, enemy_move, enemy_shot, enemy_birth, enemy_alive,
         enemy_lr, enemy_sub, bullet_x, bullet_y, bullet_alive, bullet_lr, diver_x, diver_y, diver_move, diver_alive,
         diver_lr, enemy_bullets_left, enemy_bullets_right, action, u, ramping):
    """One step, the reference's ``act`` in the same order of updates (``action`` in the full set: 0 noop, 1 left,
    2 up, 3 right, 4 down, 5 fire; ``u``: the 5 draws): ``(state, reward, terminated)``."""
    # A diver spawns when its timer is 0 (into the first free slot; slot 0 when none is).
    spawn = e_spawn_timer == 0
    d_spawn = d_spawn_timer == 0
    d_lr = where(spawn, draw(u, 3), draw(u, 0)) < 0.5
    d_row = 1 + floor_int(where(spawn, draw(u, 4), draw(u, 1)) * 8)
    d_spawn_timer = where(d_spawn, DIVER_SPAWN_SPEED, d_spawn_timer)
    d0x, d1x, d0y, d1y = slot(diver_x, 0), slot(diver_x, 1), slot(diver_y, 0), slot(diver_y, 1)
    d0m, d1m, d0, d1 = slot(diver_move, 0), slot(diver_move, 1), slot(diver_alive, 0), slot(diver_alive, 1)
    d0lr, d1lr = slot(diver_lr, 0), slot(diver_lr, 1)
    in_1 = d0 & ~d1
    in_0, in_1 = d_spawn & ~in_1, d_spawn & in_1
    d0x, d0y, d0m = where(in_0, _edge_x(d_lr), d0x), where(in_0, d_row, d0y), where(in_0, DIVER_MOVE_INTERVAL, d0m)
    d0, d0lr = d0 | in_0, where(in_0, d_lr, d0lr)
    d1x, d1y, d1m = where(in_1, _edge_x(d_lr), d1x), where(in_1, d_row, d1y), where(in_1, DIVER_MOVE_INTERVAL, d1m)
    d1, d1lr = d1 | in_1, where(in_1, d_lr, d1lr)

    # The sub fires (when the gun is cool) or moves; left and right also turn it. (Nothing here meets the enemies:
    # their spawn, which comes first, is below.)
    b0x, b1x, b0y, b1y = slot(bullet_x, 0), slot(bullet_x, 1), slot(bullet_y, 0), slot(bullet_y, 1)
    b0, b1, b0lr, b1lr = slot(bullet_alive, 0), slot(bullet_alive, 1), slot(bullet_lr, 0), slot(bullet_lr, 1)
    fire = (action == 5) & (shot_timer == 0)
    in_1 = b0 & ~b1
    in_0, in_1 = fire & ~in_1, fire & in_1
    b0x, b0y, b0, b0lr = where(in_0, sub_x, b0x), where(in_0, sub_y, b0y), b0 | in_0, where(in_0, sub_or, b0lr)
    b1x, b1y, b1, b1lr = where(in_1, sub_x, b1x), where(in_1, sub_y, b1y), b1 | in_1, where(in_1, sub_or, b1lr)
    shot_timer = where(fire, SHOT_COOL_DOWN, shot_timer)
    left, right = action == 1, action == 3
    sub_x = where(left, clamp(sub_x - 1, 0, 9), where(right, clamp(sub_x + 1, 0, 9), sub_x))
    sub_or = where(left, False, where(right, True, sub_or))
    sub_y = where(action == 2, clamp(sub_y - 1, 0, 8), where(action == 4, clamp(sub_y + 1, 0, 8), sub_y))
    # The friendly bullets move (never two in one cell).
    b0x, b1x = where(b0, b0x + _step_x(b0lr), b0x), where(b1, b1x + _step_x(b1lr), b1x)
    b0, b1 = b0 & (b0x >= 0) & (b0x <= 9), b1 & (b1x >= 0) & (b1x <= 9)

    # An enemy spawns when its timer is 0, unless its row holds one going the other way, into the first free slot
    # (slot 0 when none is). Then each friendly bullet picks the oldest fish in its new cell, else the oldest sub.
    new_lr, is_sub, row = draw(u, 0) < 0.5, draw(u, 1) < 1 / 3, 1 + floor_int(draw(u, 2) * 8)
    c0, c1 = where(b0, b0y * 10 + b0x, -1), where(b1, b1y * 10 + b1x, -1)
    _, (open_row, free, best0, best1) = each_min(
        _survey, (), (enemy_alive, enemy_x, enemy_y, enemy_lr, enemy_sub, enemy_birth),
        (row, new_lr, c0, c1), 4)
    new = spawn & (open_row == 1)
    at = where(new, where(free == MAX_ENEMIES, 0, free), -1)
    new_x, new_key = _edge_x(new_lr), _key(is_sub, n_spawned)
    best0 = where(new & b0 & (new_x == b0x) & (row == b0y), minimum(best0, new_key), best0)
    best1 = where(new & b1 & (new_x == b1x) & (row == b1y), minimum(best1, new_key), best1)
    spawned = n_spawned
    n_spawned = n_spawned + to_int(new)
    e_spawn_timer = where(spawn, e_spawn_speed, e_spawn_timer)
    hit0, hit1 = best0 != _NO_KEY, best1 != _NO_KEY
    b0, b1 = b0 & ~hit0, b1 & ~hit1
    reward = to_int(hit0) + to_int(hit1)
    live0, live1 = where(hit0, -1, c0), where(hit1, -1, c1)

    # Divers in the sub's cell (before or after their move) board it, newest first.
    d1x, d1m, d1, count = _diver(d1x, d1y, d1m, d1, d1lr, sub_x, sub_y, diver_count)
    d0x, d0m, d0, diver_count = _diver(d0x, d0y, d0m, d0, d0lr, sub_x, sub_y, count)

    # The enemies move, subs fire, and an enemy moving onto a friendly bullet dies with it: each bullet takes the
    # newest sub moving into its cell, else the newest fish.
    (enemy_x, enemy_y, enemy_move, enemy_shot, enemy_birth, enemy_alive, enemy_lr, enemy_sub), (
        player_hit, shoots, best0, best1) = each_max(
        _move_enemy, (enemy_x, enemy_y, enemy_move, enemy_shot, enemy_birth, enemy_alive, enemy_lr, enemy_sub), (),
        (at, new_x, row, new_lr, is_sub, spawned, best0, best1, live0, live1, sub_x, sub_y, move_speed),
        4)
    enemy_bullets_left, enemy_bullets_right = each_mark_if(
        shoots > 0, (enemy_bullets_left, enemy_bullets_right), _fire,
        (enemy_alive, enemy_sub, enemy_shot, enemy_lr, enemy_y, enemy_x), ())
    hit0, hit1 = best0 >= 0, best1 >= 0
    (enemy_alive,) = each(_die_landed, (enemy_alive,), (enemy_sub, enemy_birth), (best0, best1))
    b0, b1 = b0 & ~hit0, b1 & ~hit1
    reward = reward + to_int(hit0) + to_int(hit1)

    # The enemy bullets move a cell (left ones left, right ones right): one in the player's cell before or after
    # ends the game.
    cell = sub_y * 10 + sub_x
    terminal = (player_hit > 0) | slot(enemy_bullets_left, cell) | slot(enemy_bullets_right, cell)
    enemy_bullets_left = shift_cells(enemy_bullets_left, -1)
    enemy_bullets_right = shift_cells(enemy_bullets_right, 1)
    terminal = terminal | slot(enemy_bullets_left, cell) | slot(enemy_bullets_right, cell)

    # Timers, oxygen and surfacing (the oxygen bonus with 6 divers, the difficulty ramp); out of oxygen, or
    # surfacing with no diver, ends the game.
    e_spawn_timer = e_spawn_timer - to_int(e_spawn_timer > 0)
    d_spawn_timer = d_spawn_timer - to_int(d_spawn_timer > 0)
    shot_timer = shot_timer - to_int(shot_timer > 0)
    terminal = terminal | (oxygen <= 0)
    below = sub_y > 0
    arrives = ~below & ~surface
    terminal = terminal | (arrives & (diver_count == 0))
    surfaces = arrives & (diver_count != 0)
    full = surfaces & (diver_count == MAX_DIVERS_HELD)
    reward = reward + where(full, oxygen * 10 // MAX_OXYGEN, 0)
    diver_count = where(surfaces, where(full, 0, diver_count) - 1, diver_count)
    oxygen = where(below, oxygen - 1, where(surfaces, MAX_OXYGEN, oxygen))
    surface = where(below, False, surface | surfaces)
    if ramping:
        ramps = surfaces & ((e_spawn_speed > 1) | (move_speed > 2))
        move_speed = move_speed - to_int(ramps & (move_speed > 2) & (ramp_index % 2 == 1))
        e_spawn_speed = e_spawn_speed - to_int(ramps & (e_spawn_speed > 1))
        ramp_index = ramp_index + to_int(ramps)

    # The live bullets and divers move to the front of their slots, in order (the dead ones after them, in order).
    swap = b1 & ~b0
    (bullet_x, bullet_y, bullet_alive, bullet_lr) = each(
        _pair, (bullet_x, bullet_y, bullet_alive, bullet_lr), (),
        (where(swap, b1x, b0x), where(swap, b0x, b1x), where(swap, b1y, b0y), where(swap, b0y, b1y), b0 | b1, b0 & b1,
         where(swap, b1lr, b0lr), where(swap, b0lr, b1lr)))
    swap = d1 & ~d0
    (diver_x, diver_y, diver_alive, diver_lr) = each(
        _pair, (diver_x, diver_y, diver_alive, diver_lr), (),
        (where(swap, d1x, d0x), where(swap, d0x, d1x), where(swap, d1y, d0y), where(swap, d0y, d1y), d0 | d1, d0 & d1,
         where(swap, d1lr, d0lr), where(swap, d0lr, d1lr)))
    (diver_move,) = each(_choose, (diver_move,), (), (where(swap, d1m, d0m), where(swap, d0m, d1m)))
    return ((oxygen, diver_count, sub_x, sub_y, shot_timer, e_spawn_speed, e_spawn_timer, d_spawn_timer, move_speed,
             ramp_index, n_spawned, sub_or, surface, enemy_x, enemy_y, enemy_move, enemy_shot, enemy_birth,
             enemy_alive, enemy_lr, enemy_sub, bullet_x, bullet_y, bullet_alive, bullet_lr, diver_x, diver_y,
             diver_move, diver_alive, diver_lr, enemy_bullets_left, enemy_bullets_right),
            to_float(reward), terminal)


def _slot_cells(f, k, alive, x, y, lr, c):
    """A live slot's cell in channel ``c`` and its trail."""
    f = mark_if(f, c, y, x, alive)
    back = x - _step_x(lr)
    return mark_if(f, 3, y, back, alive & (back >= 0) & (back <= 9))


def _enemy_cells(f, k, alive, x, y, lr, sub):
    return _slot_cells(f, k, alive, x, y, lr, where(sub, 6, 5))


def _bullet_cells(f, k, alive, x, y):
    return mark_if(f, 2, y, x, alive)


def observe(oxygen, diver_count, sub_x, sub_y, shot_timer, e_spawn_speed, e_spawn_timer, d_spawn_timer, move_speed,
            ramp_index, n_spawned, sub_or, surface, enemy_x, enemy_y, enemy_move, enemy_shot, enemy_birth,
            enemy_alive, enemy_lr, enemy_sub, bullet_x, bullet_y, bullet_alive, bullet_lr, diver_x, diver_y,
            diver_move, diver_alive, diver_lr, enemy_bullets_left, enemy_bullets_right, storage):
    """The reference's ``state()`` frame, its channels :data:`CHANNELS`."""
    f = frame(storage, sub_x, 10, 0, sub_y, sub_x)
    f = mark(f, 1, sub_y, sub_x - _step_x(sub_or))
    f = each_mark(f, _bullet_cells, (bullet_alive, bullet_x, bullet_y), ())
    f = each_mark(f, _enemy_cells, (enemy_alive, enemy_x, enemy_y, enemy_lr, enemy_sub), ())
    f = each_mark(f, _slot_cells, (diver_alive, diver_x, diver_y, diver_lr), (9,))
    f = plane_rows(f, 4, (enemy_bullets_left, enemy_bullets_right))
    f = bar(f, 7, 9, 0, clamp(oxygen, 0, 1 << 30) * 10 // MAX_OXYGEN)
    return bar(f, 8, 9, 9 - diver_count, 9)


GAME = RulesGame(sys.modules[__name__])
