"""Seaquest's torch game against the reference (``minatar`` 1.0.15): the same frames, rewards and terminations from
the same draws over long rollouts (from the reset state and from harder ones), and the random policy's return and
episode length."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import device_params
from tests.envs.minatar_oracle import (
    FakeRandom,
    assert_close_means,
    assert_graph_capturable,
    compare_rollouts,
    random_policy_episodes,
    reference_episodes,
)

seaquest = pytest.importorskip("minatar.environments.seaquest", reason="minatar is not installed (rlstruct[minatar])")
from rlstruct.envs.minatar._seaquest.rules import GAME, MAX_BULLETS, MAX_DIVERS, MAX_ENEMIES  # noqa: E402

pytestmark = pytest.mark.timeout(300)

ACTIONS = range(6)


def _within_capacity(ref, state, i) -> None:
    """The slot counts hold what the reference holds, and no two friendly bullets share a cell (the torch step
    moves them at once)."""
    assert len(ref.e_fish) + len(ref.e_subs) <= MAX_ENEMIES
    assert len(ref.f_bullets) <= MAX_BULLETS and len(ref.divers) <= MAX_DIVERS
    assert len({(b[0], b[1]) for b in ref.f_bullets}) == len(ref.f_bullets)


# Each start is reachable: a diver count below 0 follows surfacing with 6 divers (the reference then subtracts one
# more), so such a sub surfaces without dying and ramps the difficulty each time.
SCENARIOS = {
    "reset": {},
    "diving": {"action_weights": [1, 1, 1, 1, 2, 2]},
    "crowded": {"action_weights": [1, 1, 3, 1, 2, 3],
                "overrides": {"e_spawn_speed": 1, "e_spawn_timer": 1, "move_speed": 2, "diver_count": -20}},
    "ramping": {"action_weights": [1, 1, 2, 1, 2, 1], "overrides": {"diver_count": -30}},
    "six_divers": {"overrides": {"diver_count": 4, "e_spawn_speed": 5, "move_speed": 4, "ramp_index": 1}},
}


@pytest.mark.slow  # 2.8 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_rollouts_match_the_reference(scenario):
    ramps = []

    def check(ref, state, i):
        _within_capacity(ref, state, i)
        ramps.append(ref.ramp_index)

    stats = compare_rollouts(GAME, seaquest.Env, n_envs=24, n_steps=500, actions=ACTIONS, seed=1,
                             max_episode_steps=1000, check=check, **SCENARIOS[scenario])
    assert stats["episodes"] > 20 and stats["reward"] > 20
    if scenario == "ramping":
        assert max(ramps) >= 6


@pytest.mark.parametrize("device", device_params())
def test_rollouts_match_without_ramping(device):
    compare_rollouts(GAME, seaquest.Env, n_envs=16, n_steps=300, actions=ACTIONS, seed=2,
                     ramping=False, overrides={"diver_count": -5}, device=device)


def test_random_policy_return_and_length():
    returns, lengths = random_policy_episodes(GAME, n_envs=300, actions=ACTIONS)
    ref_returns, ref_lengths = reference_episodes(seaquest.Env, n_episodes=600, actions=ACTIONS)
    assert_close_means(returns, ref_returns, "return")
    assert_close_means(lengths.astype(np.float64), ref_lengths.astype(np.float64), "episode length")


def test_step_leaves_its_input_alone_and_keeps_the_layout():
    state = GAME.reset(torch.zeros(4, 0, dtype=torch.float64), True)
    before = {k: v.clone() for k, v in state.items()}
    u = torch.zeros(4, GAME.n_step_draws, dtype=torch.float64)
    out = state
    for _ in range(25):
        out, reward, terminated = GAME.step(out, torch.tensor([5, 4, 3, 1]), u, True)
    assert all(torch.equal(before[k], v) for k, v in state.items())
    assert {k: (v.dtype, v.shape) for k, v in out.items()} == {k: (v.dtype, v.shape) for k, v in state.items()}
    assert reward.dtype == torch.float32 and terminated.dtype == torch.bool


@pytest.mark.cuda
def test_step_is_graph_capturable():
    assert_graph_capturable(GAME, actions=ACTIONS, ramping=True)


def test_fake_random_serves_the_block_in_call_order():
    fake = FakeRandom()
    fake.serve(np.array([0.1, 0.99, 0.5, 0.4, 0.0, 0.75]))
    assert (fake.rand() < 0.5, fake.randint(low=1, high=9), fake.choice(["a", "b", "c"])) == (True, 8, "b")
    assert fake.randint(4, size=2).tolist() == [1, 0] and fake.rand() == 0.75
    with pytest.raises(AssertionError, match="drew more than"):
        fake.rand()
