"""Trained runs that tests of several modules read, each trained once a session: a test that reads one is marked
with its group (``pytest.mark.xdist_group``), so that under ``--dist loadgroup`` one worker trains it for all of
them. A module that uses one imports its fixture by name; pytest then holds one fixture per module, so each run is
kept here, trained by the first of them to ask."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlstruct.algos import ppo
from tests.algos.test_learning import _common
from tests.helpers import training_runs_with

__all__ = ["WIDE_SOLVE", "ppo_cartpole_wide_solve"]

#: the xdist group of the tests that read :func:`ppo_cartpole_wide_solve`
WIDE_SOLVE = "ppo-cartpole-wide-solve"
#: the runs trained in this process, by fixture and torch thread count
_TRAINED: dict[tuple[str, int | None], tuple[Any, Path]] = {}


@pytest.fixture(scope="session")
def ppo_cartpole_wide_solve(tmp_path_factory: pytest.TempPathFactory,
                            request: pytest.FixtureRequest) -> tuple[Any, Path]:
    """PPO's wide solve of CartPole-v1, seed 0 (benchmarks/learning.py's ``ppo-cartpole-wide-torch`` settings: 2,048
    envs x 16 steps an iteration, overlapped, 2 epochs x 2 minibatches at lr 0.02 annealed over 100 iterations),
    stopped where an evaluation of 475 and its confirmation on fresh episodes agree: its
    :class:`~rlstruct.algos._train.result.TrainResult` and its log folder. Read it, never write into it. Trained
    under the session's ``--torch-threads`` as a test's own run would be (a session fixture is set up before the
    test's autouse fixtures)."""
    threads = request.config.getoption("--torch-threads", None)
    key = ("ppo_cartpole_wide_solve", threads)
    if key not in _TRAINED:
        logdir = tmp_path_factory.mktemp("ppo-cartpole-wide-solve")
        config = ppo.PPOConfig(**_common(logdir, n_envs=2048, n_steps=16, lr=0.02, n_epochs=2, n_minibatches=2,
                                         overlap=True, max_env_steps=2048 * 16 * 100, eval_every=2,
                                         target_return=475.0, seed=0))
        with training_runs_with(torch_threads=threads):
            _TRAINED[key] = ppo.train(config), logdir
    return _TRAINED[key]
