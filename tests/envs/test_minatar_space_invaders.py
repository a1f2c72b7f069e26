"""SpaceInvaders' torch game against the reference (``minatar`` 1.0.15): the same frames, rewards and terminations
over long rollouts (from the reset state and from a nearly cleared wave, so that new waves come and speed up), and
the random policy's return and episode length."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import device_params
from tests.envs.minatar_oracle import (
    assert_close_means,
    assert_graph_capturable,
    compare_rollouts,
    random_policy_episodes,
    reference_episodes,
)

space_invaders = pytest.importorskip("minatar.environments.space_invaders",
                                     reason="minatar is not installed (rlstruct[minatar])")
from rlstruct.envs.minatar._space_invaders.rules import GAME, to_cells, to_rows  # noqa: E402

pytestmark = pytest.mark.timeout(300)

MINIMAL_ACTIONS = [0, 1, 3, 5]
_FEW_ALIENS = np.zeros((10, 10))
_FEW_ALIENS[0, 3:5] = 1
_FEW_ALIENS = (_FEW_ALIENS, to_rows(torch.from_numpy(_FEW_ALIENS)))
SCENARIOS = {
    "reset": {"actions": MINIMAL_ACTIONS},
    "firing": {"actions": MINIMAL_ACTIONS, "action_weights": [1, 1, 1, 3]},
    "new_waves": {"actions": MINIMAL_ACTIONS, "action_weights": [1, 1, 1, 3],
                  "overrides": {"alien_map": _FEW_ALIENS, "alien_move_timer": 2, "enemy_move_interval": 7}},
    "all_actions_no_ramp": {"actions": range(6), "ramping": False,
                            "overrides": {"alien_map": _FEW_ALIENS, "alien_move_timer": 2}},
}


@pytest.mark.slow  # 2.9 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_rollouts_match_the_reference(scenario):
    ramps = []
    stats = compare_rollouts(GAME, space_invaders.Env, n_envs=24, n_steps=500, seed=1, max_episode_steps=1000,
                             check=lambda ref, state, i: ramps.append(ref.ramp_index), **SCENARIOS[scenario])
    assert stats["episodes"] > 20 and stats["reward"] > 100
    if scenario == "new_waves":
        assert max(ramps) == 1 and min(ramps) == 0


@pytest.mark.parametrize("device", device_params())
def test_rollouts_match_on_every_device(device):
    compare_rollouts(GAME, space_invaders.Env, n_envs=8, n_steps=200, actions=MINIMAL_ACTIONS, seed=2, device=device)


@pytest.mark.slow  # 2.3 CPU s on the reference CPU: slow is 1.5 s or more
def test_random_policy_return_and_length():
    returns, lengths = random_policy_episodes(GAME, n_envs=300, actions=MINIMAL_ACTIONS)
    ref_returns, ref_lengths = reference_episodes(space_invaders.Env, n_episodes=300, actions=MINIMAL_ACTIONS)
    assert_close_means(returns, ref_returns, "return")
    assert_close_means(lengths.astype(np.float64), ref_lengths.astype(np.float64), "episode length")


def test_step_leaves_its_input_alone_and_keeps_the_layout():
    state = GAME.reset(torch.zeros(3, 0, dtype=torch.float64), True)
    before = {k: v.clone() for k, v in state.items()}
    out = state
    for _ in range(20):
        out, reward, terminated = GAME.step(out, torch.tensor([5, 1, 3]), torch.zeros(3, 0, dtype=torch.float64), True)
    assert all(torch.equal(before[k], v) for k, v in state.items())
    assert {k: (v.dtype, v.shape) for k, v in out.items()} == {k: (v.dtype, v.shape) for k, v in state.items()}
    assert reward.dtype == torch.float32 and terminated.dtype == torch.bool


def test_row_masks_round_trip():
    cells = torch.rand(5, 10, 10) < 0.5
    assert torch.equal(to_cells(to_rows(cells)), cells)
    assert to_rows(torch.eye(10))[:3].tolist() == [1, 2, 4]


@pytest.mark.cuda
def test_step_is_graph_capturable():
    assert_graph_capturable(GAME, actions=MINIMAL_ACTIONS, n_steps=60)
