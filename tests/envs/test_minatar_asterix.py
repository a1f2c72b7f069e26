"""Torch MinAtar Asterix against minatar's own game: the same frames, rewards and terminations step after step, with
and without difficulty ramping, and the same random-policy returns and episode lengths."""

from __future__ import annotations

import pytest

pytest.importorskip("minatar", reason="the oracle is the minatar package (pip install 'rlstruct[minatar]')")

from tests.envs.minatar_oracle import assert_close_means, check_against_reference, reference_returns, torch_returns


@pytest.mark.slow  # 3.1 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.parametrize("ramping", [True, False])
def test_asterix_steps_as_the_reference(ramping):
    counts = check_against_reference("Asterix", n_envs=24, n_steps=1500, ramping=ramping)
    assert counts["episodes"] > 200 and counts["reward"] > 50
    assert counts["peak"]["ramp_index"] >= (2 if ramping else 0)


def test_asterix_random_policy_returns_as_the_reference():
    ref_ret, ref_len = reference_returns("MinAtar/Asterix-v1", 300)
    ret, length = torch_returns("Asterix", 64, 300)
    assert len(ret) > 200
    assert_close_means(ret, ref_ret, "Asterix returns")
    assert_close_means(length, ref_len, "Asterix lengths")
