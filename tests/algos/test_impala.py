"""IMPALA (``rlstruct.algos.impala``): the lag schedule read from the rows, the same run for one seed in process, over
two worker processes and beside a busy CPU, learning CartPole, its settings' errors, a worker that fails with no
restart left, and ``rlstruct eval`` and ``--resume`` of its run."""

from __future__ import annotations

import csv
import dataclasses
import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from gymnasium.envs.classic_control import CartPoleEnv

from rlstruct.algos import impala
from rlstruct.algos._train import cli, registry
from rlstruct.algos.impala import IMPALAConfig, acting_version
from tests.algos.test_same_run import without_wall_clock
from tests.helpers import rlstruct_in_process

pytestmark = [pytest.mark.timeout(300)]

SOURCE = "rlstruct.algos.impala:ALGORITHM"
#: 8 iterations of 2 envs x 4 steps, no evaluation before the final one
TINY = IMPALAConfig(n_envs=2, n_steps=4, max_env_steps=64, eval_every=1000, n_evaluation_envs=1,
                    evaluation_max_steps=10, progress=False, tensorboard=False, preset="none")
FLAGS = ["--env", "CartPole-v1", "--seed", "3", "--no-progress", "--no-tensorboard", "--preset", "none",
         "--n-envs", "4", "--n-steps", "8", "--max-env-steps", "256", "--max-lag", "2", "--eval-every", "4",
         "--n-evaluation-envs", "2", "--evaluation-max-steps", "40"]


def training_rows(logdir: str | Path) -> list[dict[str, str]]:
    """``progress.csv``'s training rows (an evaluation's row has no policy version)."""
    with open(Path(logdir) / "progress.csv") as f:
        return [row for row in csv.DictReader(f) if row["impala/policy_version"]]


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_each_acquisition_acts_with_the_weights_of_update_i_minus_the_lag(tmp_path, lag):
    result = impala.train(dataclasses.replace(TINY, max_lag=lag, logdir=str(tmp_path / "run")))
    rows = training_rows(result.logdir)
    assert [int(r["iteration"]) for r in rows] == list(range(1, 9))
    # Row i + 1 is acquisition i; the learner holds version i when it learns on it.
    assert [float(r["impala/policy_version"]) for r in rows] == [acting_version(i, lag) for i in range(8)]
    assert [float(r["impala/policy_lag"]) for r in rows] == [i - acting_version(i, lag) for i in range(8)]
    # The weights pushed are the scheduled ones: where the acting version is the learner's own, every importance
    # weight is 1; where it lags, the learner's policy has moved away from it.
    rhos = [float(r["vtrace/rho"]) for r in rows]
    for i, rho in enumerate(rhos):
        if acting_version(i, lag) == i:
            assert rho == pytest.approx(1.0, abs=1e-5), (i, rhos)
        else:
            assert abs(rho - 1.0) > 1e-6, (i, rhos)


def test_acting_version_is_the_update_max_lag_behind():
    assert [acting_version(i, 0) for i in range(4)] == [0, 1, 2, 3]
    assert [acting_version(i, 3) for i in range(6)] == [0, 0, 0, 0, 1, 2]


def progress(tmp_path: Path, name: str, *flags: str) -> list[list[str]]:
    logdir = tmp_path / name
    assert cli.main(["train", SOURCE, *FLAGS, *flags, "--logdir", str(logdir)]) == 0
    return without_wall_clock(logdir / "progress.csv")


@pytest.mark.slow  # three runs of 8 iterations, two of them with worker processes
def test_one_seed_gives_one_run_in_process_over_two_workers_and_beside_a_busy_cpu(tmp_path):
    alone = progress(tmp_path, "alone")
    header = alone[0]
    assert len(alone) > 10 and any(row[header.index("eval/return")] for row in alone[1:])
    assert progress(tmp_path, "workers", "--n-processes", "2") == alone
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        loaded = progress(tmp_path, "loaded", "--n-processes", "2")
    finally:
        burner.kill()
        burner.wait()
    assert loaded == alone


@pytest.mark.slow  # about 40k env steps; measured below
def test_it_learns_cartpole_with_two_actor_processes_and_lag_2(tmp_path):
    """Seed 0 of a short run (40,000 env steps, 16 envs x 16 steps, lag 2, two worker processes, one torch thread,
    the other settings the defaults) clears a return well above random play (about 22). Measured final returns:
    seeds 0, 1, 2 gave 340.6, 393.6 and 86.1 with the learner's one pass (``trajectory_outputs``; 340.6, 392.8 and
    84.1 before it), their evaluations every 40 iterations peaking at 341, 500 and 417 (the defaults are not tuned to
    hold 475 yet); the threshold sits under the lowest with margin."""
    config = IMPALAConfig(n_envs=16, n_steps=16, max_env_steps=40_000, max_lag=2, n_processes=2, eval_every=40,
                          n_evaluation_envs=8, stop_at_reward_threshold=False, progress=False, tensorboard=False,
                          preset="none", seed=0, logdir=str(tmp_path / "run"))
    result = impala.train(config)
    assert result.eval_return > THRESHOLD, result.eval_return


#: under the lowest of seeds 0-2's final returns (86.1), with margin; random play scores about 22
THRESHOLD = 60.0


def test_c_bar_above_rho_bar_is_an_error_naming_both():
    with pytest.raises(impala.ConfigError, match=r"c_bar must be in \[0, rho_bar\] .* got c_bar=1.5 with "
                                                 r"rho_bar=1.0; lower --c-bar or raise --rho-bar"):
        impala.train(dataclasses.replace(TINY, c_bar=1.5))


def test_a_negative_max_lag_is_an_error():
    with pytest.raises(ValueError, match=r"max_lag must be >= 0 .* got -1; pass --max-lag 0"):
        impala.train(dataclasses.replace(TINY, max_lag=-1))


@pytest.mark.parametrize(("flags", "match"), [
    (["--c-bar", "2", "--rho-bar", "1"], "c_bar must be in [0, rho_bar]"),
    (["--max-lag", "-1"], "max_lag must be >= 0"),
])
def test_a_bad_setting_is_one_line_and_status_2_on_the_command_line(capsys, tmp_path, flags, match):
    done = rlstruct_in_process(capsys, "train", SOURCE, *flags, "--logdir", str(tmp_path / "run"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and match in lines[0], lines
    assert not (tmp_path / "run").exists()


@pytest.fixture
def registered(monkeypatch):
    """``impala`` in the registry, as its line in ``ALGORITHMS`` puts it: a run records a built-in algorithm by its
    name, which ``rlstruct eval`` looks up there."""
    monkeypatch.setitem(registry.ALGORITHMS, "impala", registry.ALGORITHMS.get("impala", ("IMPALAConfig",)))


def test_its_run_evaluates_and_resumes_on_the_schedule(tmp_path, capsys, registered):
    """``--resume`` continues the schedule: the ring of the last ``max_lag + 1`` versions is in the checkpoint, and
    the resumed rows' versions continue ``max(0, i - max_lag)``. A resumed session draws its envs' and agents' seeds
    anew (as every algorithm's does), so its rows cannot equal the uninterrupted run's: the schedule and the weights
    it pushes are what is compared."""
    logdir = str(tmp_path / "run")
    first = impala.train(dataclasses.replace(TINY, max_lag=2, logdir=logdir))
    saved = torch.load(Path(logdir) / "checkpoint.pt", weights_only=True)
    ring = saved["learner"]["weights"]
    assert ring["versions"] == [6, 7, 8] and first.iterations == 8
    assert all(torch.equal(ring["weights"][-1][k], v) for k, v in saved["model"].items())

    ev = rlstruct_in_process(capsys, "eval", str(Path(logdir) / "checkpoint.pt"), "--episodes", "2")
    assert ev.returncode == 0, ev.stderr

    second = impala.train(dataclasses.replace(TINY, max_lag=2, max_env_steps=128, resume=logdir, logdir=None))
    assert second.iterations == 16
    rows = training_rows(logdir)
    assert [int(r["iteration"]) for r in rows] == list(range(1, 17))
    assert [float(r["impala/policy_version"]) for r in rows] == [acting_version(i, 2) for i in range(16)]
    # The first resumed acquisitions act with versions 6 and 7 from the ring: the learner's own is 8, so their
    # importance weights differ from 1 as the uninterrupted run's would.
    assert all(abs(float(r["vtrace/rho"]) - 1.0) > 1e-6 for r in rows[8:10])
    final = torch.load(Path(logdir) / "checkpoint.pt", weights_only=True)
    assert final["learner"]["weights"]["versions"] == [14, 15, 16]


class FailsInWorker(CartPoleEnv):
    """CartPole whose ``fail_at``-th step (counted over its episodes) raises in a worker process, and never in this
    one (the evaluator's envs step here)."""

    def __init__(self, fail_at: int = 14, **kwargs):
        super().__init__(**kwargs)
        self.fail_at, self.steps = fail_at, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_at and multiprocessing.parent_process() is not None:
            raise RuntimeError(f"FailsInWorker failure injected at step {self.steps}")
        return super().step(action)


gym.register("FailsInWorker-v0", entry_point=f"{__name__}:FailsInWorker", max_episode_steps=500)


@pytest.mark.slow  # a worker process
def test_a_worker_failing_with_no_restart_left_ends_the_run_like_a_signal(tmp_path):
    """The actors' worker raises in its 14th env step, during acquisition 3 (2 envs x 4 steps each, lag 1: launched
    before the update on acquisition 2): updates 1-3 are recorded, the collection of acquisition 3 fails, and the run
    stops as for a signal, with its checkpoint and summary (``stop_reason`` ``"worker_failed"``, the worker's
    traceback); ``--resume`` continues the schedule from that checkpoint."""
    logdir = tmp_path / "run"
    result = impala.train(dataclasses.replace(TINY, env=f"{__name__}:FailsInWorker-v0", n_processes=1, max_lag=1,
                                              restart_workers=0, logdir=str(logdir)))
    assert result.stop_reason == "worker_failed" and result.iterations == 3
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["stop_reason"] == "worker_failed" and summary["env_steps"] == 3 * 2 * 4
    failure = summary["worker_failure"]
    assert failure["worker_id"] == 0 and "FailsInWorker failure injected at step 14" in failure["traceback"]
    assert [int(r["iteration"]) for r in training_rows(logdir)] == [1, 2, 3]
    saved = torch.load(logdir / "checkpoint.pt", weights_only=True)
    assert saved["stop_reason"] == "worker_failed" and saved["env_steps"] == 24
    assert saved["learner"]["weights"]["versions"] == [2, 3]
    # --resume continues the schedule from the checkpoint (the new worker's envs count their steps from 0 again, and
    # two more acquisitions take them to step 8).
    resumed = impala.train(dataclasses.replace(TINY, env=f"{__name__}:FailsInWorker-v0", n_processes=1, max_lag=1,
                                               max_env_steps=40, resume=str(logdir), logdir=None))
    assert resumed.stop_reason == "budget" and resumed.iterations == 5
    rows = training_rows(logdir)
    assert [float(r["impala/policy_version"]) for r in rows] == [acting_version(i, 1) for i in range(5)]


def test_resuming_with_another_lag_is_refused(tmp_path):
    logdir = str(tmp_path / "run")
    impala.train(dataclasses.replace(TINY, max_lag=2, logdir=logdir))
    with pytest.raises(impala.ConfigError, match=r"max_lag must equal the checkpoint's"):
        impala.train(dataclasses.replace(TINY, max_lag=1, max_env_steps=128, resume=logdir, logdir=None))
