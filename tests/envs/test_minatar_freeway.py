"""Torch MinAtar Freeway against minatar's own game: the same frames, rewards and terminations step after step
(through the game's own 2500-step end), and the same random-policy returns."""

from __future__ import annotations

import pytest

pytest.importorskip("minatar", reason="the oracle is the minatar package (pip install 'rlstruct[minatar]')")

from tests.envs.minatar_oracle import assert_close_means, check_against_reference, reference_returns, torch_returns


@pytest.mark.slow  # 3.4 CPU s on the reference CPU: slow is 1.5 s or more
def test_freeway_steps_as_the_reference():
    counts = check_against_reference("Freeway", n_envs=16, n_steps=2600)
    assert counts["episodes"] == 16 and counts["reward"] > 0


def test_freeway_random_policy_returns_as_the_reference():
    ref_ret, ref_len = reference_returns("MinAtar/Freeway-v1", 20)
    ret, length = torch_returns("Freeway", 32, 1000)
    assert len(ret) == 32 and (length == 1000).all() and (ref_len == 1000).all()
    assert_close_means(ret, ref_ret, "Freeway returns", slack=0.1)
