"""MinAtar's SpaceInvaders as a batched torch game: the ``GAME`` constant (reset, step and observe over ``n`` envs).

The state is a flat dict of ``[n, ...]`` tensors under the reference's attribute names: the cannon's column
``pos``; the aliens and both kinds of bullets as maps ``int32 [n, 10]``, one bit mask per row (bit ``c`` of row
``r`` is cell ``(r, c)``, so a move is a shift of ten numbers, not of a hundred cells); the aliens' direction
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

__all__ = ["GAME", "SpaceInvaders", "to_rows", "to_cells"]

SHOT_COOL_DOWN = 5
ENEMY_MOVE_INTERVAL = 12
ENEMY_SHOT_INTERVAL = 10
# A new wave never moves faster than this.
FASTEST_MOVE_INTERVAL = 6
# A wave fills rows 0-3, columns 2-7.
WAVE_ROW = 0b0011111100

# Integers are int32; flags bool.
_INT = torch.int32
CHANNELS = ("cannon", "alien", "alien_left", "alien_right", "friendly_bullet", "enemy_bullet")


def to_rows(cells: Tensor) -> Tensor:
    """``int32 [..., 10]`` row masks of the map ``cells`` (``[..., 10, 10]``, nonzero where set)."""
    weights = 2 ** torch.arange(10, device=cells.device, dtype=_INT)
    return ((cells != 0).to(_INT) * weights).sum(-1, dtype=_INT)


def to_cells(rows: Tensor) -> Tensor:
    """``bool [..., 10, 10]``: the cells of the row masks ``rows`` (``int32 [..., 10]``)."""
    return (rows[..., None] >> torch.arange(10, device=rows.device, dtype=_INT)) & 1 != 0


def _bit(rows: Tensor, column: Tensor) -> Tensor:
    """``bool [n]``: bit ``column [n]`` of ``rows [n]``."""
    return (rows >> column) & 1 != 0


def _popcount(x: Tensor) -> Tensor:
    """The set bits of each 10-bit ``int32`` (the classic parallel bit count)."""
    x = x - ((x >> 1) & 0x155)
    x = (x & 0x333) + ((x >> 2) & 0x333)
    x = (x + (x >> 4)) & 0xF0F
    return (x & 0xFF) + (x >> 8)


def _wave(n: int, device: torch.device) -> Tensor:
    """``int32 [n, 10]``: a fresh wave."""
    rows = torch.zeros(n, 10, dtype=_INT, device=device)
    rows[:, 0:4] = WAVE_ROW
    return rows


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

        empty = torch.zeros(n, 10, dtype=_INT, device=dev)
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
        fire = (action == 5) & (s["shot_timer"] == 0)
        pos = s["pos"]
        shot = torch.where(fire, 1 << pos, 0)
        s["shot_timer"] = torch.where(fire, SHOT_COOL_DOWN, s["shot_timer"])
        pos = torch.where(action == 1, (pos - 1).clamp(min=0), torch.where(action == 3, (pos + 1).clamp(max=9), pos))

        # Bullets move a row (friendly up, the new shot from row 9 to 8; enemy down); those leaving are dropped.
        friendly, enemy = s["f_bullet_map"], s["e_bullet_map"]
        blank = torch.zeros_like(friendly[:, :1])
        friendly = torch.cat([friendly[:, 1:9], (friendly[:, 9] | shot)[:, None], blank], 1)
        enemy = torch.cat([blank, enemy[:, :9]], 1)
        terminal = _bit(enemy[:, 9], pos)

        aliens, direction = s["alien_map"], s["alien_dir"]
        terminal |= _bit(aliens[:, 9], pos)
        moves = s["alien_move_timer"] == 0
        count = _popcount(aliens).sum(1, dtype=_INT)
        timer = torch.where(moves, torch.minimum(count, s["enemy_move_interval"]), s["alien_move_timer"])
        at_edge = ((((aliens & 1) != 0).any(1) & (direction < 0))
                   | (((aliens & (1 << 9)) != 0).any(1) & (direction > 0)))
        down = moves & at_edge
        sideways = moves & ~at_edge
        terminal |= down & (aliens[:, 9] != 0)
        # np.roll wraps: a wave already on the bottom row comes back on top (the game is over by then). Sideways
        # nothing wraps: a wave at the edge it moves to goes down instead.
        shifted = torch.where((direction > 0)[:, None], aliens << 1, aliens >> 1)
        aliens = torch.where(down[:, None], aliens.roll(1, 1), torch.where(sideways[:, None], shifted, aliens))
        s["alien_dir"] = torch.where(down, -direction, direction)
        terminal |= moves & _bit(aliens[:, 9], pos)

        # The alien nearest the cannon fires: the nearest column holding one (the left one of two at the same
        # distance), its lowest alien.
        shoots = s["alien_shot_timer"] == 0
        columns = torch.arange(10, device=dev, dtype=_INT)
        anywhere = aliens[:, 0]
        for r in range(1, 10):
            anywhere = anywhere | aliens[:, r]
        occupied = (anywhere[:, None] >> columns) & 1 != 0
        distance = (columns - pos[:, None]).abs() * 10 + columns
        column = torch.where(occupied, distance, 1000).argmin(1).to(_INT)
        row = torch.where((aliens >> column[:, None]) & 1 != 0, columns, -1).argmax(1)
        enemy = enemy | torch.where((columns == row[:, None]) & (shoots & (anywhere != 0))[:, None],
                                    (1 << column)[:, None], 0)

        kill = aliens & friendly
        reward = _popcount(kill).sum(1).to(torch.float32)
        aliens = aliens & ~kill
        friendly = friendly & ~kill

        s["shot_timer"] = s["shot_timer"] - (s["shot_timer"] > 0).to(_INT)
        s["alien_move_timer"] = timer - 1
        s["alien_shot_timer"] = torch.where(shoots, ENEMY_SHOT_INTERVAL, s["alien_shot_timer"]) - 1
        cleared = (aliens == 0).all(1)
        if ramping:
            faster = cleared & (s["enemy_move_interval"] > FASTEST_MOVE_INTERVAL)
            s["enemy_move_interval"] = s["enemy_move_interval"] - faster.to(_INT)
            s["ramp_index"] = s["ramp_index"] + faster.to(_INT)
        s["alien_map"] = aliens | torch.where(cleared[:, None], _wave(n, dev), 0)
        s["pos"], s["f_bullet_map"], s["e_bullet_map"] = pos, friendly, enemy
        return s, reward, terminal

    def observe(self, state: dict[str, Tensor]) -> Tensor:
        """The reference's ``state()`` frame.

        Args:
            state: the state dict.

        Returns:
            ``bool [n, 10, 10, 6]``, channels in :attr:`channels`' order.
        """
        pos = state["pos"]
        n = pos.shape[0]
        rows = torch.zeros(n, 10, dtype=_INT, device=pos.device)
        rows[:, 9] = 1 << pos
        left = state["alien_dir"][:, None] < 0
        aliens = state["alien_map"]
        planes = torch.stack([rows, aliens, torch.where(left, aliens, 0), torch.where(left, 0, aliens),
                              state["f_bullet_map"], state["e_bullet_map"]], -1)
        # Every 10-bit row's cells, looked up: [n, row, channel, column] -> [n, row, column, channel].
        table = to_cells(torch.arange(1024, device=pos.device, dtype=_INT))
        cells = table.index_select(0, planes.reshape(-1).long()).view(n, 10, len(CHANNELS), 10)
        return cells.permute(0, 1, 3, 2).contiguous()


GAME = SpaceInvaders()
