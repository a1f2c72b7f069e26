"""MinAtar Asterix over batched tensors: :data:`GAME`.

The player moves in the four directions over rows 1-8; enemies and gold spawn at either side, one per row at most
(slot ``i`` is row ``i + 1``), and cross the screen. Picking up gold gives +1; touching an enemy ends the episode.
With ramping, every 100 steps the spawn interval (and every other time the move interval) shrinks.

Draws: none per reset, 3 per step, minatar's ``_spawn_entity`` when the spawn timer is up: ``u[:, 0]`` is the side
(``rand() < 1/2``: from the left, moving right), ``u[:, 1]`` gold or enemy (``rand() < 1/3``: gold), ``u[:, 2]``
the slot (``randint(k)`` over the ``k`` free slots in order: the ``floor(k u)``-th; not drawn when none is free).

State (``[B]`` unless said): ``player_x``, ``player_y``, ``spawn_speed``, ``spawn_timer``, ``move_speed``,
``move_timer``, ``ramp_timer``, ``ramp_index``; per slot (``[B, 8]``) ``alive``, ``x``, ``right`` (moving right),
``gold``.
"""

from __future__ import annotations

import torch

from rlstruct.envs.minatar._grid import cell_index, frame

__all__ = ["GAME", "Asterix"]

RAMP_INTERVAL = 100
INIT_SPAWN_SPEED = 10
INIT_MOVE_INTERVAL = 5
_N_SLOTS = 8


class Asterix:
    """The rules of MinAtar Asterix (see the module docstring).

    >>> s = GAME.reset(torch.zeros(2, 0, dtype=torch.float64), True)
    >>> s["player_x"].tolist(), s["spawn_timer"].tolist()
    ([5, 5], [10, 10])
    >>> u = torch.tensor([[0.1, 0.1, 0.0], [0.9, 0.9, 0.99]], dtype=torch.float64)
    >>> s, reward, terminated = GAME.step(s, torch.tensor([1, 2]), u, True)
    >>> s["player_x"].tolist(), s["player_y"].tolist(), GAME.observe(s).shape
    ([4, 5], [5, 4], torch.Size([2, 10, 10, 4]))
    """

    name = "asterix"
    channels = ("player", "enemy", "trail", "gold")
    n_step_draws = 3
    n_reset_draws = 0

    def reset(self, u: torch.Tensor, ramping: bool) -> dict[str, torch.Tensor]:
        """The initial states of ``B`` envs (``u``: ``float64 [B, 0]``, for the device and ``B``)."""
        n, dev = u.shape[0], u.device

        def full(v: int) -> torch.Tensor:
            return torch.full((n,), v, dtype=torch.int64, device=dev)

        no = torch.zeros(n, _N_SLOTS, dtype=torch.bool, device=dev)
        return {
            "player_x": full(5), "player_y": full(5), "spawn_speed": full(INIT_SPAWN_SPEED),
            "spawn_timer": full(INIT_SPAWN_SPEED), "move_speed": full(INIT_MOVE_INTERVAL),
            "move_timer": full(INIT_MOVE_INTERVAL), "ramp_timer": full(RAMP_INTERVAL), "ramp_index": full(0),
            "alive": no, "x": torch.zeros(n, _N_SLOTS, dtype=torch.int64, device=dev), "right": no.clone(),
            "gold": no.clone(),
        }

    def step(
        self, state: dict[str, torch.Tensor], action: torch.Tensor, u: torch.Tensor, ramping: bool
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """One step of every env with the full-set actions ``action`` (``int64 [B]``) and draws ``u``
        (``float64 [B, 3]``): ``(state, reward float32 [B], terminated bool [B])``."""
        alive, x, right, gold = state["alive"], state["x"], state["right"], state["gold"]
        spawn_speed, spawn_timer = state["spawn_speed"], state["spawn_timer"]
        # Spawn: the floor(k u)-th free slot, k the free slots.
        spawn = spawn_timer == 0
        free = ~alive
        rank = (u[:, 2] * free.sum(1)).floor().to(torch.int64)
        pick = free & (free.cumsum(1) == (rank + 1).unsqueeze(1)) & spawn.unsqueeze(1)
        from_left = (u[:, 0] < 0.5).unsqueeze(1)
        alive = alive | pick
        x = torch.where(pick, torch.where(from_left, 0, 9), x)
        right = torch.where(pick, from_left, right)
        gold = torch.where(pick, (u[:, 1] < 1 / 3).unsqueeze(1), gold)
        spawn_timer = torch.where(spawn, spawn_speed, spawn_timer)
        # The player.
        px, py = state["player_x"], state["player_y"]
        px = torch.where(action == 1, (px - 1).clamp(min=0), torch.where(action == 3, (px + 1).clamp(max=9), px))
        py = torch.where(action == 2, (py - 1).clamp(min=1), torch.where(action == 4, (py + 1).clamp(max=8), py))
        rows = torch.arange(1, _N_SLOTS + 1, device=x.device)
        on_row = (rows == py.unsqueeze(1))
        # Contact before the entities move, then after (when they move this step).
        touch = alive & on_row & (x == px.unsqueeze(1))
        reward = (touch & gold).sum(1)
        terminated = (touch & ~gold).any(1)
        alive = alive & ~(touch & gold)
        moves = state["move_timer"] == 0
        move_timer = torch.where(moves, state["move_speed"], state["move_timer"])
        x = torch.where(moves.unsqueeze(1) & alive, x + torch.where(right, 1, -1), x)
        alive = alive & (x >= 0) & (x <= 9)
        touch = moves.unsqueeze(1) & alive & on_row & (x == px.unsqueeze(1))
        reward = reward + (touch & gold).sum(1)
        terminated = terminated | (touch & ~gold).any(1)
        alive = alive & ~(touch & gold)
        spawn_timer = spawn_timer - 1
        move_timer = move_timer - 1
        move_speed, ramp_timer, ramp_index = state["move_speed"], state["ramp_timer"], state["ramp_index"]
        if ramping:
            ramps = (spawn_speed > 1) | (move_speed > 1)
            bump = ramps & (ramp_timer < 0)
            move_speed = move_speed - (bump & (move_speed > 1) & ((ramp_index & 1) == 1)).to(torch.int64)
            spawn_speed = spawn_speed - (bump & (spawn_speed > 1)).to(torch.int64)
            ramp_index = ramp_index + bump.to(torch.int64)
            ramp_timer = torch.where(bump, RAMP_INTERVAL, ramp_timer - ramps.to(torch.int64))
        nxt = {
            "player_x": px, "player_y": py, "spawn_speed": spawn_speed, "spawn_timer": spawn_timer,
            "move_speed": move_speed, "move_timer": move_timer, "ramp_timer": ramp_timer, "ramp_index": ramp_index,
            "alive": alive, "x": x, "right": right, "gold": gold,
        }
        return nxt, reward.to(torch.float32), terminated

    def observe(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """The frames ``bool [B, 10, 10, 4]`` (minatar's ``state()``)."""
        alive, x, right, gold = state["alive"], state["x"], state["right"], state["gold"]
        px = state["player_x"]
        n = px.shape[0]
        rows = torch.arange(1, _N_SLOTS + 1, device=x.device).expand(n, _N_SLOTS)
        back = x - torch.where(right, 1, -1)
        here = cell_index(rows, x)
        return frame(4, [
            (0, cell_index(state["player_y"], px).unsqueeze(1), None),
            (1, here, alive & ~gold), (3, here, alive & gold),
            (2, cell_index(rows, back), alive & (back >= 0) & (back <= 9)),
        ])


GAME = Asterix()
