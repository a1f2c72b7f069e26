"""Schedules run over env steps, never over the wall clock: the same seed and settings give the same progress.csv on
an idle machine and under load (wall-time columns aside), and a schedule without a step budget is refused."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from rlstruct.algos import a2c, ppo
from rlstruct.algos._train.session import validate
from rlstruct.errors import ConfigError
from tests.helpers import rlstruct_in_process

#: the columns that measure time: the only ones that may differ between two runs of one seed
WALL_COLUMNS = {"wall_time_s", "eval/blocked_s"}


#: a CPU burner for up to two minutes: a bare interpreter, which starts in a fraction of the second that one importing
#: this module (torch) would take
BUSY = "import time\nuntil = time.monotonic() + 120\nwhile time.monotonic() < until:\n    pass\n"


def _rows(path) -> list[dict[str, str]]:
    with open(path) as f:
        return [{k: v for k, v in row.items() if k not in WALL_COLUMNS} for row in csv.DictReader(f)]


@pytest.mark.parametrize("algo", ["a2c", "ppo"])
@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_same_seed_gives_the_same_rows_idle_and_under_load(algo, tmp_path, capsys):
    # No step budget given: the learning rate anneals over the bare defaults' (it annealed over the time limit once,
    # so that load changed every update); a low target ends both runs after a few thousand steps. Both runs are the
    # console script's code in this process: what the load could change is the run's schedule, not the interpreter,
    # and the second run starting in a process that already ran one is no easier on the claim.
    flags = ["train", algo, "--env", "CartPole-v1", "--target-return", "60", "--n-envs", "8", "--eval-every", "4",
             "--n-evaluation-envs", "2", "--evaluation-max-steps", "100", "--no-progress", "--no-tensorboard",
             "--seed", "3"]
    idle = rlstruct_in_process(capsys, *flags, "--logdir", str(tmp_path / "idle"))
    assert idle.returncode == 0, idle.stderr
    load = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    try:
        loaded = rlstruct_in_process(capsys, *flags, "--logdir", str(tmp_path / "loaded"))
    finally:
        for p in load:
            p.terminate()
            p.wait()
    assert loaded.returncode == 0, loaded.stderr
    idle_rows, loaded_rows = _rows(tmp_path / "idle" / "progress.csv"), _rows(tmp_path / "loaded" / "progress.csv")
    assert len(idle_rows) > 5 and idle_rows == loaded_rows


@pytest.mark.parametrize("module, cls", [(a2c, a2c.A2CConfig), (ppo, ppo.PPOConfig)])
def test_annealing_without_a_step_budget_is_refused_and_a_constant_rate_needs_none(module, cls):
    with pytest.raises(ConfigError, match=r"anneal_lr decays the learning rate over the step budget max_env_steps, "
                                          r"got max_env_steps=None; pass --max-env-steps N .* or --no-anneal-lr"):
        validate(module.ALGORITHM, cls(max_env_steps=None))
    assert validate(module.ALGORITHM, cls(max_env_steps=None, anneal_lr=False)).config.max_env_steps is None


@pytest.mark.parametrize("cls", [a2c.A2CConfig, ppo.PPOConfig])
def test_bare_defaults_have_a_step_budget(cls):
    assert cls().max_env_steps is not None and cls().max_env_steps > 0
