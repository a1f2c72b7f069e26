"""MinAtar Breakout over batched tensors: :data:`GAME`.

A paddle on the bottom row bounces a ball that travels along diagonals and breaks the three rows of bricks at the
top (+1 a brick; a new wall when the ball reaches the bottom row with every brick gone); the episode ends when the
ball reaches the bottom row beside the paddle. Draws: one per reset (minatar's ``randint(2)``, the ball's start:
left going down-right, or right going down-left), none per step.

State (``[B]`` unless said): ``ball_x``, ``ball_y``, ``ball_dir`` (``0`` up-left, ``1`` up-right, ``2``
down-right, ``3`` down-left), ``pos`` (the paddle's column), ``last_x``, ``last_y`` (the ball's previous cell, the
trail), ``strike`` (bool: the ball hit a brick at the previous step), ``bricks`` (``bool [B, 10, 10]``).
"""

from __future__ import annotations

import torch

from rlstruct.envs.minatar._grid import cell_index, frame

__all__ = ["GAME", "Breakout"]

# Directions 0-3 are up-left, up-right, down-right, down-left: a bounce off a side wall is ``d ^ 1`` (minatar's
# [1, 0, 3, 2]), off the top, a brick or the paddle's middle ``3 - d`` ([3, 2, 1, 0]), off the paddle's edge
# ``d ^ 2`` ([2, 3, 0, 1]). Arithmetic, not lookup tables: no constant tensor to keep per device.


class Breakout:
    """The rules of MinAtar Breakout (see the module docstring); ``ramping`` has no effect (Breakout does not ramp).

    >>> u = torch.tensor([[0.2], [0.7]], dtype=torch.float64)
    >>> s = GAME.reset(u, True)
    >>> s["ball_x"].tolist(), s["ball_dir"].tolist()
    ([0, 9], [2, 3])
    >>> s, reward, terminated = GAME.step(s, torch.tensor([3, 1]), u[:, :0], True)
    >>> s["ball_x"].tolist(), s["ball_y"].tolist(), s["pos"].tolist(), GAME.observe(s).shape
    ([1, 8], [4, 4], [5, 3], torch.Size([2, 10, 10, 4]))
    """

    name = "breakout"
    channels = ("paddle", "ball", "trail", "brick")
    n_step_draws = 0
    n_reset_draws = 1

    def reset(self, u: torch.Tensor, ramping: bool) -> dict[str, torch.Tensor]:
        """The initial states of ``B`` envs from the draws ``u`` (``float64 [B, 1]``)."""
        n, dev = u.shape[0], u.device
        right = (u[:, 0] * 2).floor().to(torch.int64) == 1
        ball_x = torch.where(right, 9, 0)
        ball_y = torch.full((n,), 3, dtype=torch.int64, device=dev)
        bricks = torch.zeros(n, 10, 10, dtype=torch.bool, device=dev)
        bricks[:, 1:4] = True
        return {
            "ball_x": ball_x, "ball_y": ball_y, "ball_dir": torch.where(right, 3, 2),
            "pos": torch.full((n,), 4, dtype=torch.int64, device=dev), "last_x": ball_x.clone(),
            "last_y": ball_y.clone(), "strike": torch.zeros(n, dtype=torch.bool, device=dev), "bricks": bricks,
        }

    def step(
        self, state: dict[str, torch.Tensor], action: torch.Tensor, u: torch.Tensor, ramping: bool
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """One step of every env with the full-set actions ``action`` (``int64 [B]``): ``(state, reward float32
        [B], terminated bool [B])``."""
        pos = state["pos"]
        pos = torch.where(action == 1, (pos - 1).clamp(min=0), pos)
        pos = torch.where(action == 3, (pos + 1).clamp(max=9), pos)
        ball_x, ball_y, d = state["ball_x"], state["ball_y"], state["ball_dir"]
        new_x = ball_x + torch.where((d == 1) | (d == 2), 1, -1)
        new_y = ball_y + torch.where(d <= 1, -1, 1)
        side = (new_x < 0) | (new_x > 9)
        new_x = new_x.clamp(0, 9)
        d = torch.where(side, d ^ 1, d)
        top = new_y < 0
        new_y = torch.where(top, 0, new_y)
        d = torch.where(top, 3 - d, d)
        n = action.shape[0]
        bricks = state["bricks"].reshape(n, 100)
        cell = cell_index(new_y, new_x).unsqueeze(1)
        there = bricks.gather(1, cell).squeeze(1)
        brick = ~top & there
        broken = brick & ~state["strike"]
        bricks = bricks.scatter(1, cell, (there & ~broken).unsqueeze(1))
        new_y = torch.where(broken, ball_y, new_y)
        d = torch.where(broken, 3 - d, d)
        bottom = ~top & ~brick & (new_y == 9)
        refill = bottom & ~bricks.any(1)
        wall = torch.zeros(100, dtype=torch.bool, device=action.device)
        wall[10:40] = True
        bricks = bricks | (refill.unsqueeze(1) & wall)
        centre = bottom & (ball_x == pos)
        corner = bottom & ~centre & (new_x == pos)
        d = torch.where(centre, 3 - d, torch.where(corner, d ^ 2, d))
        new_y = torch.where(centre | corner, ball_y, new_y)
        terminated = bottom & ~centre & ~corner
        nxt = {
            "ball_x": new_x, "ball_y": new_y, "ball_dir": d, "pos": pos, "last_x": ball_x, "last_y": ball_y,
            "strike": brick, "bricks": bricks.view(n, 10, 10),
        }
        return nxt, broken.to(torch.float32), terminated

    def observe(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """The frames ``bool [B, 10, 10, 4]`` (minatar's ``state()``)."""
        return frame(4, [
            (0, (state["pos"] + 90).unsqueeze(1), None),
            (1, cell_index(state["ball_y"], state["ball_x"]).unsqueeze(1), None),
            (2, cell_index(state["last_y"], state["last_x"]).unsqueeze(1), None),
        ], planes=((3, state["bricks"]),))


GAME = Breakout()
