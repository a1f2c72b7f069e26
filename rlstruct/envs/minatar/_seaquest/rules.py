"""MinAtar's Seaquest as a batched torch game: the ``GAME`` constant (reset, step and observe over ``n`` envs).

The state is a flat dict of ``[n, ...]`` tensors: the player's scalars under the reference's attribute names; the
fish and enemy subs in ``MAX_ENEMIES`` slots (``enemy_*``) ordered by their spawn number; the friendly bullets and
the divers in ``MAX_BULLETS`` and ``MAX_DIVERS`` slots (``bullet_*``, ``diver_*``), oldest first, the live ones a
prefix; the enemy bullets as two ``[10, 10]`` grids, one per direction (they meet nothing but the player, so
bullets sharing a cell act as one).

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

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["GAME", "Seaquest"]

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
# One shot every 5 steps, each gone within 9 steps.
MAX_BULLETS = 2
# One diver every 30 steps, each gone within 60 steps.
MAX_DIVERS = 2

# Integers are int32 (the enemies' spawn numbers grow with the episode); flags are bool.
_INT = torch.int32
# An enemy's rank among those in one cell: subs after fish, then by spawn number.
_SUB_RANK = 2**30
CHANNELS = ("sub_front", "sub_back", "friendly_bullet", "trail", "enemy_bullet", "enemy_fish", "enemy_sub",
            "oxygen_guage", "diver_guage", "diver")
_C = len(CHANNELS)
_SCALARS = {"oxygen": MAX_OXYGEN, "diver_count": 0, "sub_x": 5, "sub_y": 0, "shot_timer": 0,
            "e_spawn_speed": INIT_SPAWN_SPEED, "e_spawn_timer": INIT_SPAWN_SPEED, "d_spawn_timer": DIVER_SPAWN_SPEED,
            "move_speed": INIT_MOVE_INTERVAL, "ramp_index": 0, "n_spawned": 0}
_SLOTS = {"enemy": (MAX_ENEMIES, ("x", "y", "move", "shot", "birth"), ("alive", "lr", "sub")),
          "bullet": (MAX_BULLETS, ("x", "y"), ("alive", "lr")),
          "diver": (MAX_DIVERS, ("x", "y", "move"), ("alive", "lr"))}


def _one_hot(index: Tensor, k: int) -> Tensor:
    """``bool [..., k]``: ``True`` at ``index [...]``."""
    return torch.arange(k, device=index.device) == index[..., None]


def _append(state: dict[str, Tensor], group: str, where: Tensor, values: dict[str, Tensor]) -> None:
    """Writes ``values`` (``[n]`` each, by field name) into the first free slot of ``group`` in the envs ``where``
    (in place on the dict, not the tensors); the slot becomes alive. Every env has a free slot (the slot counts
    are the most the reference holds)."""
    free = ~state[f"{group}_alive"]
    slot = free.to(torch.uint8).argmax(1, keepdim=True)
    values = dict(values, alive=torch.ones_like(where))
    for name, value in values.items():
        old = state[f"{group}_{name}"]
        kept = old.gather(1, slot)[:, 0]
        state[f"{group}_{name}"] = old.scatter(1, slot, torch.where(where, value.to(old.dtype), kept)[:, None])


def _pick(mask: Tensor, key: Tensor, largest: bool) -> Tensor:
    """``bool [..., K]``: among ``mask``'s slots (last dim) the one with the largest ``key``, or the smallest."""
    if largest:
        index = torch.where(mask, key, -1).argmax(-1)
    else:
        index = torch.where(mask, key, torch.iinfo(key.dtype).max).argmin(-1)
    return mask & _one_hot(index, mask.shape[-1])


def _any_bullet(kill: Tensor) -> Tensor:
    """``bool [n, K]``: ``kill [n, bullet, K]`` or-ed over the bullets (a reduction over a short middle dim is slow
    on the CPU)."""
    out = kill[:, 0]
    for b in range(1, kill.shape[1]):
        out = out | kill[:, b]
    return out


def _compact(state: dict[str, Tensor], group: str) -> None:
    """Moves ``group``'s live slots to the front, keeping their order (in place on the dict, not the tensors)."""
    _, ints, flags = _SLOTS[group]
    order = torch.sort((~state[f"{group}_alive"]).to(torch.uint8), dim=1, stable=True).indices
    for name in ints + flags:
        state[f"{group}_{name}"] = state[f"{group}_{name}"].gather(1, order)


def _step_x(lr: Tensor) -> Tensor:
    """``+1`` moving right, ``-1`` moving left (``int32``)."""
    return lr.to(_INT) * 2 - 1


def _edge_x(lr: Tensor) -> Tensor:
    """Where a spawn enters: column 0 moving right, 9 moving left (``int32``)."""
    return 9 - lr.to(_INT) * 9


@dataclass(frozen=True)
class Seaquest:
    """The game's rules (see the module docstring for the state and the draws)."""

    name: str = "seaquest"
    channels: tuple[str, ...] = CHANNELS
    n_step_draws: int = 5
    n_reset_draws: int = 0

    def reset(self, u: Tensor, ramping: bool) -> dict[str, Tensor]:
        """The start state of ``u.shape[0]`` envs (the sub at the surface, full oxygen, nothing else).

        Args:
            u: ``float64 [n, 0]``, the reset's (no) draws; its device is the state's.
            ramping: whether the difficulty ramps (the state is the same either way).

        Returns:
            The state dict, every tensor ``[n, ...]``.
        """
        n, dev = u.shape[0], u.device
        state = {k: torch.full((n,), v, dtype=_INT, device=dev) for k, v in _SCALARS.items()}
        state["sub_or"] = torch.zeros(n, dtype=torch.bool, device=dev)
        state["surface"] = torch.ones(n, dtype=torch.bool, device=dev)
        for group, (k, ints, flags) in _SLOTS.items():
            for name in ints:
                state[f"{group}_{name}"] = torch.zeros(n, k, dtype=_INT, device=dev)
            for name in flags:
                state[f"{group}_{name}"] = torch.zeros(n, k, dtype=torch.bool, device=dev)
        state["enemy_bullets"] = torch.zeros(n, 2, 10, 10, dtype=torch.bool, device=dev)
        return state

    def step(self, state: dict[str, Tensor], action: Tensor, u: Tensor,
             ramping: bool) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        """One step of every env, the reference's ``act`` in the same order of updates.

        Args:
            state: the state dict (not modified).
            action: ``int64 [n]`` in the full action set (0 noop, 1 left, 2 up, 3 right, 4 down, 5 fire).
            u: ``float64 [n, 5]``, the step's draws (module docstring).
            ramping: whether surfacing speeds the enemies up.

        Returns:
            ``(state, reward float32 [n], terminated bool [n])``; a step from a terminal state is not defined.
        """
        s = dict(state)
        n = action.shape[0]
        reward = torch.zeros(n, dtype=_INT, device=action.device)
        terminal = torch.zeros(n, dtype=torch.bool, device=action.device)
        self._spawn(s, u)
        self._act(s, action)
        reward += self._move_bullets(s)
        self._move_divers(s)
        hit, player_hit = self._move_enemies(s)
        reward += hit
        terminal |= player_hit | self._move_enemy_bullets(s)
        surfaced, drowned = self._breathe(s, ramping)
        reward += surfaced
        terminal |= drowned
        _compact(s, "bullet")
        _compact(s, "diver")
        return s, reward.to(torch.float32), terminal

    def _spawn(self, s: dict[str, Tensor], u: Tensor) -> None:
        """An enemy (unless its row holds one going the other way) and a diver, each when its timer is 0."""
        spawn = s["e_spawn_timer"] == 0
        lr, is_sub, row = u[:, 0] < 0.5, u[:, 1] < 1 / 3, 1 + (u[:, 2] * 8).to(_INT)
        alive = s["enemy_alive"]
        blocked = (alive & (s["enemy_y"] == row[:, None]) & (s["enemy_lr"] != lr[:, None])).any(1)
        new = spawn & ~blocked
        _append(s, "enemy", new, {"x": _edge_x(lr), "y": row, "move": s["move_speed"],
                                  "shot": torch.full_like(row, ENEMY_SHOT_INTERVAL), "birth": s["n_spawned"],
                                  "lr": lr, "sub": is_sub})
        s["n_spawned"] = s["n_spawned"] + new
        s["e_spawn_timer"] = torch.where(spawn, s["e_spawn_speed"], s["e_spawn_timer"])

        du = torch.where(spawn[:, None], u[:, 3:5], u[:, 0:2])
        spawn = s["d_spawn_timer"] == 0
        lr, row = du[:, 0] < 0.5, 1 + (du[:, 1] * 8).to(_INT)
        _append(s, "diver", spawn, {"x": _edge_x(lr), "y": row, "move": torch.full_like(row, DIVER_MOVE_INTERVAL),
                                    "lr": lr})
        s["d_spawn_timer"] = torch.where(spawn, DIVER_SPAWN_SPEED, s["d_spawn_timer"])

    def _act(self, s: dict[str, Tensor], action: Tensor) -> None:
        """Fires (when the gun is cool) or moves the sub; left and right also turn it."""
        fire = (action == 5) & (s["shot_timer"] == 0)
        _append(s, "bullet", fire, {"x": s["sub_x"], "y": s["sub_y"], "lr": s["sub_or"]})
        s["shot_timer"] = torch.where(fire, SHOT_COOL_DOWN, s["shot_timer"])
        left, right = action == 1, action == 3
        s["sub_x"] = torch.where(left, (s["sub_x"] - 1).clamp(min=0),
                                 torch.where(right, (s["sub_x"] + 1).clamp(max=9), s["sub_x"]))
        s["sub_or"] = torch.where(left, False, torch.where(right, True, s["sub_or"]))
        s["sub_y"] = torch.where(action == 2, (s["sub_y"] - 1).clamp(min=0),
                                 torch.where(action == 4, (s["sub_y"] + 1).clamp(max=8), s["sub_y"]))

    def _move_bullets(self, s: dict[str, Tensor]) -> Tensor:
        """Moves the friendly bullets; each kills the oldest fish in its new cell, else the oldest sub.

        The reference moves them one at a time, newest first; two never share a cell (the sub is never faster
        than its bullets), so here they move at once.

        Returns:
            ``int32 [n]``, the kills.
        """
        alive = s["bullet_alive"]
        x = torch.where(alive, s["bullet_x"] + _step_x(s["bullet_lr"]), s["bullet_x"])
        alive = alive & (x >= 0) & (x <= 9)
        # [n, bullet, enemy]
        here = (alive[:, :, None] & s["enemy_alive"][:, None] & (x[:, :, None] == s["enemy_x"][:, None])
                & (s["bullet_y"][:, :, None] == s["enemy_y"][:, None]))
        kill = _pick(here, (s["enemy_sub"].to(_INT) * _SUB_RANK + s["enemy_birth"])[:, None], largest=False)
        hit = kill.any(2)
        s["enemy_alive"] = s["enemy_alive"] & ~_any_bullet(kill)
        s["bullet_x"], s["bullet_alive"] = x, alive & ~hit
        return hit.sum(1, dtype=_INT)

    def _move_divers(self, s: dict[str, Tensor]) -> None:
        """Divers in the sub's cell (before or after their move) board it, newest first, while it holds fewer than 6."""
        alive, moves = s["diver_alive"], s["diver_move"] == 0
        sub_x, sub_y = s["sub_x"][:, None], s["sub_y"][:, None]
        x = torch.where(moves, s["diver_x"] + _step_x(s["diver_lr"]), s["diver_x"])
        inside = (x >= 0) & (x <= 9)
        row = s["diver_y"] == sub_y
        boards = alive & row & ((s["diver_x"] == sub_x) | (moves & inside & (x == sub_x)))
        count, boarded = s["diver_count"], [None] * MAX_DIVERS
        for d in reversed(range(MAX_DIVERS)):
            boarded[d] = boards[:, d] & (count < MAX_DIVERS_HELD)
            count = count + boarded[d]
        s["diver_count"] = count
        s["diver_alive"] = alive & inside & ~torch.stack(boarded, 1)
        s["diver_x"] = x
        s["diver_move"] = torch.where(moves, DIVER_MOVE_INTERVAL, s["diver_move"] - 1)

    def _move_enemies(self, s: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Moves the enemies, subs fire, and an enemy moving onto a friendly bullet dies with it.

        The reference runs the subs, then the fish, newest first, each taking the oldest bullet in its cell; here
        each bullet (no two share a cell) takes the newest sub moving into its cell, else the newest fish.

        Returns:
            ``(kills int32 [n], player hit bool [n])``.
        """
        alive, is_sub = s["enemy_alive"], s["enemy_sub"]
        sub_x, sub_y = s["sub_x"][:, None], s["sub_y"][:, None]
        player_hit = (alive & (s["enemy_x"] == sub_x) & (s["enemy_y"] == sub_y)).any(1)
        moves = alive & (s["enemy_move"] == 0)
        x = torch.where(moves, s["enemy_x"] + _step_x(s["enemy_lr"]), s["enemy_x"])
        out = moves & ((x < 0) | (x > 9))
        on_player = moves & ~out & (x == sub_x) & (s["enemy_y"] == sub_y)
        player_hit = player_hit | on_player.any(1)
        shoots = alive & is_sub & ~out & (s["enemy_shot"] == 0)
        s["enemy_shot"] = torch.where(is_sub, torch.where(s["enemy_shot"] == 0, ENEMY_SHOT_INTERVAL,
                                                          s["enemy_shot"] - 1), s["enemy_shot"])
        s["enemy_move"] = torch.where(moves, s["move_speed"][:, None], s["enemy_move"] - 1)
        s["enemy_x"] = x
        alive = alive & ~out
        landed = moves & ~out & ~on_player
        # [n, bullet, enemy]
        here = (landed[:, None] & s["bullet_alive"][:, :, None] & (s["bullet_x"][:, :, None] == x[:, None])
                & (s["bullet_y"][:, :, None] == s["enemy_y"][:, None]))
        kill = _pick(here, (is_sub.to(_INT) * _SUB_RANK + s["enemy_birth"])[:, None], largest=True)
        hit = kill.any(2)
        s["enemy_alive"], s["bullet_alive"] = alive & ~_any_bullet(kill), s["bullet_alive"] & ~hit
        # The new enemy bullets: one grid per direction, cell y * 10 + x; those that do not fire write to a spare cell.
        n = alive.shape[0]
        cell = torch.where(shoots, s["enemy_lr"].to(_INT) * 100 + s["enemy_y"] * 10 + x, 200).long()
        fired = torch.zeros(n, 201, dtype=torch.bool, device=alive.device).scatter_(1, cell, True)
        s["enemy_bullets"] = s["enemy_bullets"] | fired[:, :200].reshape(n, 2, 10, 10)
        return hit.sum(1, dtype=_INT), player_hit

    def _move_enemy_bullets(self, s: dict[str, Tensor]) -> Tensor:
        """Moves the enemy bullets a cell; returns ``bool [n]``: one is in the player's cell before or after."""
        grids = s["enemy_bullets"]
        n = grids.shape[0]
        cell = (s["sub_y"] * 10 + s["sub_x"]).long()[:, None]
        hit = (grids[:, 0] | grids[:, 1]).reshape(n, 100).gather(1, cell)[:, 0]
        blank = torch.zeros_like(grids[:, 0, :, :1])
        grids = torch.stack([torch.cat([grids[:, 0, :, 1:], blank], 2), torch.cat([blank, grids[:, 1, :, :-1]], 2)], 1)
        s["enemy_bullets"] = grids
        return hit | (grids[:, 0] | grids[:, 1]).reshape(n, 100).gather(1, cell)[:, 0]

    def _breathe(self, s: dict[str, Tensor], ramping: bool) -> tuple[Tensor, Tensor]:
        """Timers, oxygen and surfacing (with the difficulty ramp).

        Returns:
            ``(reward int32 [n], terminal bool [n])``: the oxygen bonus of a surfacing with 6 divers; out of
            oxygen, or surfacing with none.
        """
        for name in ("e_spawn_timer", "d_spawn_timer", "shot_timer"):
            s[name] = s[name] - (s[name] > 0).to(_INT)
        oxygen, count = s["oxygen"], s["diver_count"]
        terminal = oxygen <= 0
        below = s["sub_y"] > 0
        arrives = ~below & ~s["surface"]
        terminal = terminal | (arrives & (count == 0))
        surfaces = arrives & (count != 0)
        full = surfaces & (count == MAX_DIVERS_HELD)
        reward = torch.where(full, torch.div(oxygen * 10, MAX_OXYGEN, rounding_mode="floor"), 0)
        s["diver_count"] = torch.where(surfaces, torch.where(full, 0, count) - 1, count)
        s["oxygen"] = torch.where(below, oxygen - 1, torch.where(surfaces, MAX_OXYGEN, oxygen))
        s["surface"] = torch.where(below, False, s["surface"] | surfaces)
        if ramping:
            spawn_speed, move_speed = s["e_spawn_speed"], s["move_speed"]
            ramps = surfaces & ((spawn_speed > 1) | (move_speed > 2))
            s["move_speed"] = move_speed - (ramps & (move_speed > 2) & (s["ramp_index"] % 2 == 1)).to(_INT)
            s["e_spawn_speed"] = spawn_speed - (ramps & (spawn_speed > 1)).to(_INT)
            s["ramp_index"] = s["ramp_index"] + ramps.to(_INT)
        return reward, terminal

    def observe(self, state: dict[str, Tensor]) -> Tensor:
        """The reference's ``state()`` frame.

        Args:
            state: the state dict.

        Returns:
            ``bool [n, 10, 10, 10]``, channels in :attr:`channels`' order.
        """
        s = state
        n = s["sub_x"].shape[0]
        dev = s["sub_x"].device
        cells, shows = [], []

        def put(x: Tensor, y: Tensor, channel: Tensor | int, show: Tensor) -> None:
            # Cells not shown go to (0, 0, enemy_bullet), which is overwritten below.
            cells.append(torch.where(show, (y * 10 + x) * _C + channel, 4))
            shows.append(show)

        always = torch.ones_like(s["sub_or"])
        put(s["sub_x"], s["sub_y"], 0, always)
        put(s["sub_x"] - _step_x(s["sub_or"]), s["sub_y"], 1, always)
        put(s["bullet_x"], s["bullet_y"], 2, s["bullet_alive"])
        put(s["enemy_x"], s["enemy_y"], torch.where(s["enemy_sub"], 6, 5), s["enemy_alive"])
        put(s["diver_x"], s["diver_y"], 9, s["diver_alive"])
        for group in ("enemy", "diver"):
            trail = s[f"{group}_x"] - _step_x(s[f"{group}_lr"])
            put(trail, s[f"{group}_y"], 3, s[f"{group}_alive"] & (trail >= 0) & (trail <= 9))
        cells = torch.cat([c if c.dim() == 2 else c[:, None] for c in cells], 1).long()
        frame = torch.zeros(n, 100 * _C, dtype=torch.bool, device=dev).scatter_(1, cells, True).view(n, 10, 10, _C)
        frame[..., 4] = s["enemy_bullets"][:, 0] | s["enemy_bullets"][:, 1]
        columns = torch.arange(10, device=dev)
        oxygen = torch.div(s["oxygen"].clamp(min=0) * 10, MAX_OXYGEN, rounding_mode="floor")
        frame[:, 9, :, 7] = columns < oxygen[:, None]
        frame[:, 9, :, 8] = (columns >= 9 - s["diver_count"][:, None]) & (columns < 9)
        return frame


GAME = Seaquest()
