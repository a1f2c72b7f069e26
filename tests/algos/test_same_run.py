"""One seed, one run, whatever the number of processes: ``rlstruct train`` writes the same ``progress.csv`` (its
wall-clock columns aside) in process and over worker processes, for the on-policy and the off-policy loop, on a
torch simulator and a gymnasium env, for the Gaussian and the recurrent policy, and for a preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlstruct.algos._train import cli
from rlstruct.errors import ConfigError
from tests.helpers import train_with_a_worker_killed

pytestmark = [pytest.mark.timeout(300)]

COMMON = ["--env", "CartPole-v1", "--seed", "3", "--no-progress", "--no-tensorboard", "--preset", "none",
          "--n-envs", "4", "--n-evaluation-envs", "2", "--evaluation-max-steps", "40"]
RUNS = {
    "ppo": ["--n-steps", "16", "--n-minibatches", "2", "--n-epochs", "2", "--max-env-steps", "256", "--eval-every",
            "2"],
    "dqn": ["--max-env-steps", "320", "--learning-starts", "96", "--gradient-steps", "2", "--batch-size", "32",
            "--epsilon-decay-steps", "200", "--eval-every", "20"],
}


def without_wall_clock(path: Path) -> list[list[str]]:
    """``progress.csv``'s rows without the columns that measure time (their names end in ``_s``)."""
    rows = [line.split(",") for line in path.read_text().splitlines()]
    keep = [i for i, name in enumerate(rows[0]) if not name.endswith("_s")]
    return [[row[i] if i < len(row) else "" for i in keep] for row in rows]


def progress(tmp_path: Path, name: str, algo: str, *flags: str) -> list[list[str]]:
    """``rlstruct train ALGO FLAGS`` in this process: its progress.csv without the wall-clock columns."""
    logdir = tmp_path / name
    assert cli.main(["train", algo, *flags, "--logdir", str(logdir)]) == 0
    return without_wall_clock(logdir / "progress.csv")


@pytest.mark.slow  # 2.1 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
@pytest.mark.parametrize("algo", sorted(RUNS))
def test_a_run_is_the_same_in_process_and_over_worker_processes(tmp_path, algo, backend):
    flags = [*COMMON, *RUNS[algo], "--backend", backend]
    alone = progress(tmp_path, "alone", algo, *flags)
    assert len(alone) > 3 and any(row[alone[0].index("eval/return")] for row in alone[1:])
    modes = ("1", "2") if (algo, backend) == ("ppo", "torch") else ("2",)
    for n in modes:
        assert progress(tmp_path, f"workers-{n}", algo, *flags, "--n-processes", n) == alone, n


@pytest.mark.slow  # 1.9 CPU s on the reference CPU: slow is 1.5 s or more
def test_a_recurrent_run_is_the_same_in_process_and_over_two_workers(tmp_path):
    """The LSTM policy (``--recurrent``) on CartPoleNoVel: its draws and its memory do not depend on the split."""
    flags = [*COMMON, "--env", "CartPoleNoVel-v1", "--recurrent", "--n-steps", "16", "--n-minibatches", "2",
             "--n-epochs", "2", "--max-env-steps", "192", "--eval-every", "2"]
    alone = progress(tmp_path, "alone", "ppo", *flags)
    assert len(alone) > 3 and any(row[alone[0].index("eval/return")] for row in alone[1:])
    assert progress(tmp_path, "workers", "ppo", *flags, "--n-processes", "2") == alone


def test_a_gaussian_policys_run_is_the_same_in_process_and_over_two_workers(tmp_path):
    """PPO on Pendulum: the Gaussian's normal draws (Box-Muller over two hashed streams) do not depend on the split."""
    flags = [*COMMON, "--env", "Pendulum-v1", "--n-steps", "16", "--n-minibatches", "2", "--n-epochs", "2",
             "--max-env-steps", "192", "--eval-every", "2"]
    alone = progress(tmp_path, "alone", "ppo", *flags)
    assert len(alone) > 3 and any(row[alone[0].index("eval/return")] for row in alone[1:])
    assert progress(tmp_path, "workers", "ppo", *flags, "--n-processes", "2") == alone


@pytest.mark.slow  # 2.2 CPU s on the reference CPU: slow is 1.5 s or more
def test_a_presets_run_is_the_same_in_process_and_with_two_workers(tmp_path):
    flags = ["--env", "CartPole-v1", "--preset", "a2c-cartpole", "--seed", "1", "--max-env-steps", "2048",
             "--no-progress", "--no-tensorboard", "--eval-every", "1", "--n-evaluation-envs", "2"]
    alone = progress(tmp_path, "alone", "a2c", *flags)
    assert progress(tmp_path, "workers", "a2c", *flags, "--n-processes", "2") == alone


def test_n_envs_is_the_total_and_must_split_evenly_over_the_workers():
    from rlstruct.algos._train.config import RunConfig, validate_run_config

    with pytest.raises(ConfigError, match=r"n_envs is the training envs in all, split evenly over the 3 training "
                                          r"workers .*got --n-envs 4; pass a multiple of 3, e.g. --n-envs 3"):
        validate_run_config(RunConfig(n_envs=4, n_processes=3))
    validate_run_config(RunConfig(n_envs=6, n_processes=3))


@pytest.mark.slow
def test_a_worker_sigkilled_mid_run_changes_nothing(tmp_path):
    """``--restart-workers``: a training worker SIGKILLed while the run goes on is replaced exactly, and the run writes
    the progress.csv of the same command run in process (wall-clock columns and the restart count aside).

    8 iterations, their rows written out every 2 (``--log-every``, which changes when rows reach the file, not what
    they hold), so that the kill lands after the first rows reach the file and about six iterations follow it. The
    killed run is forked from this process with its own fork server (``tests.helpers.ForkedCommand``): the workers'
    replacement is the claim, not an interpreter's start."""
    flags = ["a2c", "--env", "CartPole-v1", "--preset", "a2c-cartpole", "--seed", "1", "--max-env-steps", "8192",
             "--no-progress", "--no-tensorboard", "--eval-every", "4", "--log-every", "2", "--n-evaluation-envs", "2",
             "--restart-workers", "3"]
    alone = progress(tmp_path, "alone", *flags)
    logdir = tmp_path / "killed"
    killed, run = train_with_a_worker_killed(["train", *flags, "--n-processes", "2", "--logdir", str(logdir)], logdir,
                                             after_rows=2, timeout=240)
    err = run.stderr
    assert killed is not None, "the run ended before a worker could be killed"
    assert run.returncode == 0, err[-2000:]
    assert "exact: the same seeds and state" in err
    rows = without_wall_clock(logdir / "progress.csv")
    restarts = rows[0].index("batcher/restarts")
    assert [r[restarts] for r in rows[1:] if r[restarts]][-1] == "1"
    assert [r[:restarts] + r[restarts + 1:] for r in rows] == [r[:restarts] + r[restarts + 1:] for r in alone]
