"""``pytest --torch-threads N`` (tests/conftest.py): every training run a test starts in its process uses N torch
threads, whatever its config says, and the thread count is the caller's again after the run."""

from __future__ import annotations

import pytest

from tests.helpers import run_generated_suite

TESTS = '''
import json
from pathlib import Path

import torch

from rlstruct.algos import a2c


def test_a_run(tmp_path):
    before = torch.get_num_threads()
    result = a2c.train(a2c.A2CConfig(max_env_steps=64, n_envs=4, n_evaluation_envs=2, eval_every=100,
                                     hidden_sizes=(8,), progress=False, tensorboard=False, logdir=str(tmp_path)))
    saved = json.loads((Path(result.logdir) / "config.json").read_text())
    print("threads", saved["torch_threads"], "seed", saved["seed"], "restored", torch.get_num_threads() == before)
'''


@pytest.mark.timeout(200)
@pytest.mark.slow
def test_torch_threads_sets_every_training_runs_threads(tmp_path):
    # The config's torch_threads is 1 (its default): the run saved 2 only if the option gave it.
    out = run_generated_suite(tmp_path, TESTS, "-s", "-q", "--torch-threads", "2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "threads 2 seed 0 restored True" in out.stdout, out.stdout[-3000:]
