"""MinAtar Freeway over batched tensors: :data:`GAME`.

A chicken crosses eight lanes of traffic from the bottom row to the top (+1, then back to the bottom and new car
speeds); it moves up or down at most every third step, and a car that reaches it sends it back to the bottom. Cars
wrap around the screen, car ``i`` in row ``i + 1``, each moving one cell every ``|speed|`` + 1 steps in the
direction of the speed's sign. The game ends after 2500 steps (the gymnasium ids truncate at 1000 first).

Draws: 16 per reset and 16 per step, minatar's ``_randomize_cars``: ``u[:, :8]`` are ``randint(1, 6, 8)`` (the
speeds, ``1 + floor(5 u)``), ``u[:, 8:]`` are ``rand(8)`` (the directions, ``sign(u - 1/2)``). A step uses them when
the chicken reaches the top.

State (``[B]`` unless said): ``pos`` (the chicken's row, in column 4), ``move_timer``, ``terminate_timer``,
``car_x``, ``car_timer``, ``car_speed`` (``int64 [B, 8]``, the speed signed by the direction).
"""

from __future__ import annotations

import torch

from rlstruct.envs.minatar._grid import cell_index, frame

__all__ = ["GAME", "Freeway"]

PLAYER_SPEED = 3
TIME_LIMIT = 2500
_N_CARS = 8


def _speeds(u: torch.Tensor) -> torch.Tensor:
    """The signed speeds ``int64 [B, 8]`` of minatar's ``_randomize_cars`` from its 16 draws ``u [B, 16]``."""
    speed = 1 + (u[:, :_N_CARS] * 5).floor().to(torch.int64)
    return speed * torch.sign(u[:, _N_CARS:] - 0.5).to(torch.int64)


class Freeway:
    """The rules of MinAtar Freeway (see the module docstring); ``ramping`` has no effect (Freeway does not ramp).

    >>> u = torch.full((1, 16), 0.9, dtype=torch.float64)
    >>> s = GAME.reset(u, True)
    >>> s["car_speed"].tolist(), s["pos"].tolist()
    ([[5, 5, 5, 5, 5, 5, 5, 5]], [9])
    >>> s, reward, terminated = GAME.step(s, torch.tensor([2]), u, True)
    >>> s["car_timer"].tolist(), GAME.observe(s).shape
    ([[4, 4, 4, 4, 4, 4, 4, 4]], torch.Size([1, 10, 10, 7]))
    """

    name = "freeway"
    channels = ("chicken", "car", "speed1", "speed2", "speed3", "speed4", "speed5")
    n_step_draws = 16
    n_reset_draws = 16

    def reset(self, u: torch.Tensor, ramping: bool) -> dict[str, torch.Tensor]:
        """The initial states of ``B`` envs from the draws ``u`` (``float64 [B, 16]``)."""
        n, dev = u.shape[0], u.device
        speed = _speeds(u)
        return {
            "pos": torch.full((n,), 9, dtype=torch.int64, device=dev),
            "move_timer": torch.full((n,), PLAYER_SPEED, dtype=torch.int64, device=dev),
            "terminate_timer": torch.full((n,), TIME_LIMIT, dtype=torch.int64, device=dev),
            "car_x": torch.zeros(n, _N_CARS, dtype=torch.int64, device=dev),
            "car_timer": speed.abs(), "car_speed": speed,
        }

    def step(
        self, state: dict[str, torch.Tensor], action: torch.Tensor, u: torch.Tensor, ramping: bool
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """One step of every env with the full-set actions ``action`` (``int64 [B]``) and draws ``u``
        (``float64 [B, 16]``): ``(state, reward float32 [B], terminated bool [B])``."""
        pos, move_timer = state["pos"], state["move_timer"]
        ready = move_timer == 0
        up = (action == 2) & ready
        down = (action == 4) & ready
        move_timer = torch.where(up | down, PLAYER_SPEED, move_timer)
        pos = torch.where(up, (pos - 1).clamp(min=0), torch.where(down, (pos + 1).clamp(max=9), pos))
        win = pos == 0
        new_speed = _speeds(u)
        speed = torch.where(win.unsqueeze(1), new_speed, state["car_speed"])
        timer = torch.where(win.unsqueeze(1), new_speed.abs(), state["car_timer"])
        pos = torch.where(win, 9, pos)
        # Only the car of the chicken's row (car pos - 1) can reach it; it does before or after it moves.
        lane = pos - 1
        on_road = (lane >= 0) & (lane < _N_CARS)
        lane = lane.clamp(0, _N_CARS - 1).unsqueeze(1)
        x = state["car_x"]
        hit = x.gather(1, lane).squeeze(1) == 4
        moves = timer == 0
        timer = torch.where(moves, speed.abs(), timer - 1)
        x = torch.where(moves, x + torch.where(speed > 0, 1, -1), x)
        x = torch.where(x < 0, 9, torch.where(x > 9, 0, x))
        hit = on_road & (hit | (x.gather(1, lane).squeeze(1) == 4))
        pos = torch.where(hit, 9, pos)
        move_timer = move_timer - (move_timer > 0).to(torch.int64)
        terminate_timer = state["terminate_timer"] - 1
        nxt = {"pos": pos, "move_timer": move_timer, "terminate_timer": terminate_timer, "car_x": x,
               "car_timer": timer, "car_speed": speed}
        return nxt, win.to(torch.float32), terminate_timer < 0

    def observe(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """The frames ``bool [B, 10, 10, 7]`` (minatar's ``state()``)."""
        pos, x, speed = state["pos"], state["car_x"], state["car_speed"]
        n = pos.shape[0]
        rows = torch.arange(1, _N_CARS + 1, device=pos.device).expand(n, _N_CARS)
        back = x - torch.where(speed > 0, 1, -1)
        back = torch.where(back < 0, 9, torch.where(back > 9, 0, back))
        trail = cell_index(rows, back)
        # The trail's channel is speed1 ... speed5 for |speed| 1 ... 5 (a speed of 0 has none).
        cells = [(0, (pos * 10 + 4).unsqueeze(1), None), (1, cell_index(rows, x), None),
                 (1 + speed.abs(), trail, speed != 0)]
        return frame(len(self.channels), cells)


GAME = Freeway()
