"""Assertions and arguments shared by the batcher test modules (importable, so no test module imports another)."""

from __future__ import annotations

import pytest
import torch

from rlstruct import Trajectories
from rlstruct.errors import BatcherStateError

__all__ = ["AUTORESET", "EPISODIC", "assert_refused_while_pending", "assert_same"]

EPISODIC = {"n_envs": 3, "episode_lengths": (2, 4, 7)}
AUTORESET = {"n_envs": 3, "episode_lengths": (2, 4, 7), "autoreset": True}


def assert_same(a: Trajectories, b: Trajectories) -> None:
    """``a`` and ``b`` hold the same keys, lengths, and bits wherever a step is valid."""
    assert list(a.info.keys()) == list(b.info.keys())
    assert list(a.trajectories.keys()) == list(b.trajectories.keys())
    assert torch.equal(a.trajectories.lengths, b.trajectories.lengths)
    m = a.trajectories.mask().bool()
    for k in a.trajectories.keys():
        assert torch.equal(a.trajectories[k][m], b.trajectories[k][m]), k
    for k in a.info.keys():
        assert torch.equal(a.info[k], b.info[k]), k


def assert_refused_while_pending(b) -> None:
    """``b`` (any batcher, an execute pending) refuses update, reset and a second execute until get."""
    with pytest.raises(BatcherStateError, match="pending; call get"):
        b.update({})
    with pytest.raises(BatcherStateError, match="pending; call get"):
        b.reset()
    with pytest.raises(BatcherStateError, match="another execute"):
        b.execute()
