"""Torch MinAtar Breakout against minatar's own game: the same frames, rewards and terminations step after step,
and the same random-policy returns and episode lengths."""

from __future__ import annotations

import pytest

pytest.importorskip("minatar", reason="the oracle is the minatar package (pip install 'rlstruct[minatar]')")

from tests.envs.minatar_oracle import assert_close_means, check_against_reference, reference_returns, torch_returns


@pytest.mark.slow  # 3.7 CPU s on the reference CPU: slow is 1.5 s or more
def test_breakout_steps_as_the_reference():
    counts = check_against_reference("Breakout", n_envs=32, n_steps=2000)
    assert counts["episodes"] > 500 and counts["reward"] > 100


def test_breakout_random_policy_returns_as_the_reference():
    ref_ret, ref_len = reference_returns("MinAtar/Breakout-v1", 300)
    ret, length = torch_returns("Breakout", 256, 200)
    assert len(ret) > 1000
    assert_close_means(ret, ref_ret, "Breakout returns")
    assert_close_means(length, ref_len, "Breakout lengths")
