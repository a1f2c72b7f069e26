"""The MinAtar games' compiled kernels (``_jit_driver.game_module``) against their torch games, env by env:
from the states of torch rollouts (random actions and draws, ramping on and off, finished rows reset, some rows from
harder starts), each kernel's ``step`` on row ``i`` of numpy copies gives the torch step's next state (every key, bit
for bit), reward and termination; ``reset`` and ``observe`` give ``GAME.reset``'s and ``GAME.observe``'s rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlstruct.envs.minatar._env import GAMES, game, has_kernels

pytest.importorskip("numba", reason="numba is not installed (rlstruct[fast])")

# slow: numba compiles each game's rules for these calls (not cached on disk: only the loops that inline them are), up
# to 20 CPU s for Seaquest's step. One xdist worker runs the module, so that each game's rules compile once (51 CPU s
# in all, against 73 when the two workers each compiled the games whose tests they drew).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.xdist_group("minatar_kernels")]

# Rows per game: 32 give each harder start 8 rows and end 10 episodes at least; Freeway's random chickens need 64
# for one to cross (its score, and the draws its step uses).
N_ENVS = {"freeway": 64}
N_STEPS = 200
# Harder starts (after the oracle tests' scenarios), each on its share of the rows, the rest from GAME.reset: a
# Seaquest sub that surfaces with no diver without dying (so the difficulty ramps), a crowded sea, six divers
# aboard (the oxygen bonus); a SpaceInvaders wave of two aliens (new waves, faster, and the fastest), and two
# aliens at the bottom-left corner about to move (down, and round to the top).
_FEW_ALIENS = [0b11000] + [0] * 9
STARTS = {
    "seaquest": [{"diver_count": -20}, {"e_spawn_speed": 1, "e_spawn_timer": 1, "move_speed": 2, "diver_count": -20},
                 {"diver_count": 6, "e_spawn_speed": 5, "move_speed": 4, "ramp_index": 1}],
    "space_invaders": [{"alien_map": _FEW_ALIENS, "alien_move_timer": 2, "enemy_move_interval": 7},
                       {"alien_map": _FEW_ALIENS, "enemy_move_interval": 6},
                       {"alien_map": [0] * 9 + [0b11], "alien_move_timer": 0}],
}


def _kernel_names() -> list[str]:
    return [minatar for minatar, _ in GAMES.values()]


def _kernels(name: str):
    if not has_kernels(name):
        pytest.skip(f"no compiled kernels for {name}")
    from rlstruct.envs.minatar._jit_driver import game_module

    return game_module(name)


def _reset(rules, name: str, n: int, ramping: bool, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """``GAME.reset`` of ``n`` rows, row ``i`` from start ``i % (1 + len(STARTS[name]))`` (0: the reset state)."""
    state = rules.reset(torch.rand(n, rules.n_reset_draws, dtype=torch.float64, generator=gen), ramping)
    starts = STARTS.get(name, [])
    for j, overrides in enumerate(starts):
        rows = torch.arange(n) % (1 + len(starts)) == j + 1
        for key, value in overrides.items():
            state[key][rows] = torch.as_tensor(value, dtype=state[key].dtype)
    return state


def _arrays(state: dict[str, torch.Tensor], keys: tuple[str, ...]) -> tuple[np.ndarray, ...]:
    return tuple(state[k].numpy().copy() for k in keys)


def _assert_rows_equal(got: tuple[np.ndarray, ...], want: dict[str, torch.Tensor], keys: tuple[str, ...],
                       what: str) -> None:
    for key, array in zip(keys, got):
        expected = want[key].numpy()
        assert array.dtype == expected.dtype, f"{what}: {key} dtype"
        bad = np.flatnonzero((array != expected).reshape(len(array), -1).any(1))
        assert bad.size == 0, f"{what}: {key} differs in rows {bad.tolist()[:8]}"


@pytest.mark.parametrize("ramping", [True, False], ids=["ramping", "no_ramping"])
@pytest.mark.parametrize("name", _kernel_names())
@pytest.mark.slow
def test_kernels_match_the_torch_game(name, ramping):
    jit = _kernels(name)
    rules, _ = game(name)
    n_envs = N_ENVS.get(name, 32)
    gen = torch.Generator().manual_seed(7)
    state = _reset(rules, name, n_envs, ramping, gen)
    assert jit.STATE_KEYS == tuple(state)
    keys = jit.STATE_KEYS
    frames = np.empty((n_envs, 10, 10, len(rules.channels)), dtype=bool)
    rewards, flags = np.empty(n_envs, dtype=np.float32), np.empty(n_envs, dtype=bool)
    episodes, total = 0, 0.0
    for t in range(N_STEPS):
        action = torch.randint(0, 6, (n_envs,), generator=gen)
        u = torch.rand(n_envs, rules.n_step_draws, dtype=torch.float64, generator=gen)
        arrays, u_np, action_np = _arrays(state, keys), u.numpy(), action.numpy()
        state, reward, terminated = rules.step(state, action, u, ramping)
        frames[:] = True  # observe clears the frame first
        for i in range(n_envs):
            rewards[i], flags[i] = jit.step(arrays, i, action_np[i], u_np[i], ramping)
            jit.observe(arrays, i, frames[i])
        np.testing.assert_array_equal(rewards, reward.numpy(), err_msg=f"{name} step {t}: rewards")
        np.testing.assert_array_equal(flags, terminated.numpy(), err_msg=f"{name} step {t}: terminations")
        bad = np.flatnonzero((frames != rules.observe(state).numpy()).reshape(n_envs, -1).any(1))
        assert bad.size == 0, f"{name} step {t}: frames differ in rows {bad.tolist()[:8]}"
        _assert_rows_equal(arrays, state, keys, f"{name} step {t}")
        total += float(reward.sum())
        if terminated.any():
            episodes += int(terminated.sum())
            fresh = _reset(rules, name, n_envs, ramping, gen)
            mask = terminated.view(-1, 1)
            state = {k: torch.where(mask.view((-1,) + (1,) * (v.dim() - 1)), fresh[k], v) for k, v in state.items()}
    # Freeway's episodes end at the time limit only, which the games leave to the env.
    assert total > 0 and (episodes >= 10 or name == "freeway")


@pytest.mark.parametrize("name", _kernel_names())
def test_reset_matches_the_torch_game(name):
    jit = _kernels(name)
    rules, _ = game(name)
    gen = torch.Generator().manual_seed(3)
    u = torch.rand(16, rules.n_reset_draws, dtype=torch.float64, generator=gen)
    want = rules.reset(u, True)
    # Rows that held another state first: a rollout's.
    state = rules.reset(torch.rand(16, rules.n_reset_draws, dtype=torch.float64, generator=gen), True)
    for _ in range(30):
        action = torch.randint(0, 6, (16,), generator=gen)
        draws = torch.rand(16, rules.n_step_draws, dtype=torch.float64, generator=gen)
        nxt, _, terminated = rules.step(state, action, draws, True)
        # A finished row keeps its last state (a step from a terminal state is not defined).
        state = {k: torch.where(terminated.view((-1,) + (1,) * (v.dim() - 1)), state[k], v) for k, v in nxt.items()}
    arrays = _arrays(state, jit.STATE_KEYS)
    for i in range(16):
        jit.reset(arrays, i, u[i].numpy(), True)
    _assert_rows_equal(arrays, want, jit.STATE_KEYS, f"{name} reset")


def _seaquest_crowded_cells() -> dict[str, torch.Tensor]:
    """Two Seaquest envs, env 0 with what random play seldom reaches: a fish and a sub moving into a bullet's cell
    in one step (the sub dies), a bullet moving into a cell holding a fish and a sub (the fish dies), and two
    divers boarding together with room for one (the newer boards)."""
    from rlstruct.envs.minatar._seaquest.rules import GAME

    state = GAME.reset(torch.zeros(2, 0, dtype=torch.float64), True)

    def put(group: str, slot: int, **values: int) -> None:
        for key, value in dict(values, alive=True).items():
            state[f"{group}_{key}"][0, slot] = value

    state["sub_x"][0], state["sub_y"][0], state["surface"][0], state["diver_count"][0] = 5, 3, False, 5
    put("bullet", 0, x=4, y=5, lr=True)
    put("bullet", 1, x=7, y=6, lr=False)
    put("enemy", 0, x=4, y=5, lr=True, sub=True, move=0, shot=4, birth=2)
    put("enemy", 1, x=4, y=5, lr=True, sub=False, move=0, shot=4, birth=3)
    put("enemy", 2, x=6, y=6, lr=False, sub=True, move=3, shot=4, birth=1)
    put("enemy", 3, x=6, y=6, lr=False, sub=False, move=3, shot=4, birth=5)
    put("diver", 0, x=5, y=3, lr=True, move=2)
    put("diver", 1, x=5, y=3, lr=False, move=2)
    return state


def test_seaquest_kernel_on_crowded_cells():
    jit = _kernels("seaquest")
    from rlstruct.envs.minatar._seaquest.rules import GAME

    state = _seaquest_crowded_cells()
    arrays = _arrays(state, jit.STATE_KEYS)
    u = torch.full((2, GAME.n_step_draws), 0.5, dtype=torch.float64)
    nxt, reward, terminated = GAME.step(state, torch.zeros(2, dtype=torch.int64), u, True)
    assert reward.tolist() == [2.0, 0.0] and nxt["diver_count"].tolist() == [6, 0]
    assert nxt["enemy_alive"][0, :4].tolist() == [False, True, True, False]
    for i in range(2):
        assert jit.step(arrays, i, 0, u[i].numpy(), True) == (reward[i].item(), terminated[i].item())
    _assert_rows_equal(arrays, nxt, jit.STATE_KEYS, "seaquest crowded cells")
