"""MinAtar's SpaceInvaders as a batched torch game: the ``GAME`` constant (reset, step and observe over ``n`` envs).

The state is a flat dict of ``[n, ...]`` tensors under the reference's attribute names: the cannon's column
``pos``, the aliens and both kinds of bullets as ``bool [n, 10, 10]`` maps (row, column), the aliens' direction
(``-1`` left, ``+1`` right) and the timers. The game draws no random numbers: ``n_step_draws`` and
``n_reset_draws`` are 0.

>>> import torch
>>> state = GAME.reset(torch.rand(2, 0, dtype=torch.float64), ramping=True)
>>> state, reward, terminated = GAME.step(state, torch.tensor([5, 1]), torch.rand(2, 0, dtype=torch.float64),
...                                       ramping=True)
>>> GAME.observe(state).shape, state["pos"].tolist(), reward.tolist()
(torch.Size([2, 10, 10, 6]), [5, 4], [0.0, 0.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["GAME", "SpaceInvaders"]

SHOT_COOL_DOWN = 5
ENEMY_MOVE_INTERVAL = 12
ENEMY_SHOT_INTERVAL = 10
# A new wave never moves faster than this.
FASTEST_MOVE_INTERVAL = 6

# Integers are int32; maps and flags bool.
_INT = torch.int32
CHANNELS = ("cannon", "alien", "alien_left", "alien_right", "friendly_bullet", "enemy_bullet")


def _wave(n: int, device: torch.device) -> Tensor:
    """``bool [n, 10, 10]``: a fresh wave, rows 0-3 and columns 2-7."""
    grid = torch.zeros(n, 10, 10, dtype=torch.bool, device=device)
    grid[:, 0:4, 2:8] = True
    return grid


def _at(grid: Tensor, row: Tensor | int, col: Tensor) -> Tensor:
    """``bool [n]``: ``grid[i, row_i, col_i]`` for each env ``i``."""
    n = grid.shape[0]
    return grid.reshape(n, 100).gather(1, (row * 10 + col).long().expand(n)[:, None])[:, 0]


@dataclass(frozen=True)
class SpaceInvaders:
    """The game's rules (see the module docstring for the state)."""

    name: str = "space_invaders"
    channels: tuple[str, ...] = CHANNELS
    n_step_draws: int = 0
    n_reset_draws: int = 0

    def reset(self, u: Tensor, ramping: bool) -> dict[str, Tensor]:
        """The start state of ``u.shape[0]`` envs: the cannon in column 5 under a full wave moving left.

        Args:
            u: ``float64 [n, 0]``; its device is the state's.
            ramping: whether the difficulty ramps (the state is the same either way).

        Returns:
            The state dict, every tensor ``[n, ...]``.
        """
        n, dev = u.shape[0], u.device

        def full(value: int) -> Tensor:
            return torch.full((n,), value, dtype=_INT, device=dev)

        empty = torch.zeros(n, 10, 10, dtype=torch.bool, device=dev)
        return {"pos": full(5), "f_bullet_map": empty, "e_bullet_map": empty.clone(), "alien_map": _wave(n, dev),
                "alien_dir": full(-1), "enemy_move_interval": full(ENEMY_MOVE_INTERVAL),
                "alien_move_timer": full(ENEMY_MOVE_INTERVAL), "alien_shot_timer": full(ENEMY_SHOT_INTERVAL),
                "ramp_index": full(0), "shot_timer": full(0)}

    def step(self, state: dict[str, Tensor], action: Tensor, u: Tensor,
             ramping: bool) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        """One step of every env, the reference's ``act`` in the same order of updates.

        Args:
            state: the state dict (not modified).
            action: ``int64 [n]`` in the full action set (0 noop, 1 left, 3 right, 5 fire; 2 and 4 do nothing).
            u: ``float64 [n, 0]``.
            ramping: whether each new wave moves faster.

        Returns:
            ``(state, reward float32 [n], terminated bool [n])``; a step from a terminal state is not defined.
        """
        s = dict(state)
        n, dev = action.shape[0], action.device
        columns = torch.arange(10, device=dev)
        fire = (action == 5) & (s["shot_timer"] == 0)
        pos = s["pos"]
        friendly = s["f_bullet_map"].clone()
        friendly[:, 9] |= fire[:, None] & (columns == pos[:, None])
        s["shot_timer"] = torch.where(fire, SHOT_COOL_DOWN, s["shot_timer"])
        pos = torch.where(action == 1, (pos - 1).clamp(min=0), torch.where(action == 3, (pos + 1).clamp(max=9), pos))

        # Bullets move a row (friendly up, enemy down); those leaving the screen are dropped.
        blank = torch.zeros_like(friendly[:, :1])
        friendly = torch.cat([friendly[:, 1:], blank], 1)
        enemy = torch.cat([blank, s["e_bullet_map"][:, :-1]], 1)
        terminal = _at(enemy, 9, pos)

        aliens, direction = s["alien_map"], s["alien_dir"]
        terminal |= _at(aliens, 9, pos)
        moves = s["alien_move_timer"] == 0
        count = aliens.sum((1, 2), dtype=_INT)
        timer = torch.where(moves, torch.minimum(count, s["enemy_move_interval"]), s["alien_move_timer"])
        at_edge = (aliens[:, :, 0].any(1) & (direction < 0)) | (aliens[:, :, 9].any(1) & (direction > 0))
        down = moves & at_edge
        sideways = moves & ~at_edge
        terminal |= down & aliens[:, 9].any(1)
        # np.roll wraps: a wave already on the bottom row comes back on top (the game is over by then).
        shifted = torch.where((direction > 0)[:, None, None], aliens.roll(1, 2), aliens.roll(-1, 2))
        aliens = torch.where(down[:, None, None], aliens.roll(1, 1),
                             torch.where(sideways[:, None, None], shifted, aliens))
        s["alien_dir"] = torch.where(down, -direction, direction)
        terminal |= moves & _at(aliens, 9, pos)

        # The alien nearest the cannon fires: the nearest column holding one (the left one of two at the same
        # distance), its lowest alien.
        shoots = s["alien_shot_timer"] == 0
        occupied = aliens.any(1)
        distance = (columns - pos[:, None]).abs() * 10 + columns
        column = torch.where(occupied, distance, 1000).argmin(1)
        in_column = aliens.gather(2, column.view(n, 1, 1).expand(n, 10, 1))[:, :, 0]
        row = torch.where(in_column, columns, -1).argmax(1)
        target = (columns.view(1, 10, 1) == row.view(n, 1, 1)) & (columns.view(1, 1, 10) == column.view(n, 1, 1))
        enemy = enemy | ((shoots & occupied.any(1)).view(n, 1, 1) & target)

        kill = aliens & friendly
        reward = kill.sum((1, 2)).to(torch.float32)
        aliens = aliens & ~kill
        friendly = friendly & ~kill

        s["shot_timer"] = s["shot_timer"] - (s["shot_timer"] > 0).to(_INT)
        s["alien_move_timer"] = timer - 1
        s["alien_shot_timer"] = torch.where(shoots, ENEMY_SHOT_INTERVAL, s["alien_shot_timer"]) - 1
        cleared = ~aliens.any((1, 2))
        if ramping:
            faster = cleared & (s["enemy_move_interval"] > FASTEST_MOVE_INTERVAL)
            s["enemy_move_interval"] = s["enemy_move_interval"] - faster.to(_INT)
            s["ramp_index"] = s["ramp_index"] + faster.to(_INT)
        s["alien_map"] = aliens | (cleared[:, None, None] & _wave(n, dev))
        s["pos"], s["f_bullet_map"], s["e_bullet_map"] = pos, friendly, enemy
        return s, reward, terminal

    def observe(self, state: dict[str, Tensor]) -> Tensor:
        """The reference's ``state()`` frame.

        Args:
            state: the state dict.

        Returns:
            ``bool [n, 10, 10, 6]``, channels in :attr:`channels`' order.
        """
        aliens, pos = state["alien_map"], state["pos"]
        n = aliens.shape[0]
        columns = torch.arange(10, device=pos.device)
        cannon = torch.zeros_like(aliens)
        cannon[:, 9] = columns == pos[:, None]
        left = (state["alien_dir"] < 0).view(n, 1, 1)
        return torch.stack([cannon, aliens, aliens & left, aliens & ~left, state["f_bullet_map"],
                            state["e_bullet_map"]], -1)


GAME = SpaceInvaders()
