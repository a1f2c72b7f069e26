"""benchmarks/published.py --population: a row's seeds run as one population in one process (``rlstruct train
--seeds``), killed and resumed as one, their members the row's run folders as solo runs write them."""

from __future__ import annotations

import json
import signal
import time

import pytest

from benchmarks import published
from tests.helpers import wall_limit
from tests.project.forked_runs import fork_the_runs

STEPS = 16_384  # two PPO iterations of ppo-minatar-5m (64 envs x 128 steps)


def test_a_rows_seeds_gather_into_one_population_a_state(tmp_path):
    root = tmp_path / "runs"
    resumable = published.run_folder(root, "breakout", "ppo", 2)
    resumable.mkdir(parents=True)
    (resumable / "checkpoint.pt").write_bytes(b"")
    runs = [("breakout", "ppo", s) for s in (0, 1, 2)] + [("freeway", "ppo", 0)]
    assert published.populations(root, runs) == [("breakout", "ppo", [0, 1]), ("breakout", "ppo", [2]),
                                                  ("freeway", "ppo", [0])]
    fresh = published.population_command(root, "breakout", "ppo", [0, 1], resume=False, max_env_steps=STEPS)
    assert fresh[:8] == ["train", "ppo", "--env", "MinAtar/Breakout-v1", "--preset", "ppo-minatar-5m", "--seeds", "0,1"]
    assert fresh[fresh.index("--logdir") + 1] == str(root / "ppo-breakout")
    again = published.population_command(root, "breakout", "ppo", [0, 1], resume=True)
    assert again[:6] == ["train", "ppo", "--resume", str(root / "ppo-breakout"), "--seeds", "0,1"]


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_killed_population_resumes_and_its_members_are_the_rows_runs(tmp_path, capsys, monkeypatch):
    """The population's two commands (the one killed, the one resuming it) forked from this process as fresh ones
    (``tests.project.forked_runs``): the claim is what the script does with them, not an interpreter's start."""
    fork_the_runs(published, tmp_path / "forked", monkeypatch)
    root = tmp_path / "runs"
    members = [published.run_folder(root, "breakout", "ppo", s) for s in (0, 1)]
    proc = published.start_population(root, "breakout", "ppo", [0, 1], max_env_steps=1_000_000, every=1)
    try:
        deadline = time.monotonic() + wall_limit(120)
        while not all((m / "checkpoint.pt").is_file() for m in members):
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoints"
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        proc.log.close()
    assert [published.run_state(m) for m in members] == ["resumable", "resumable"]

    args = ["--root", str(root), "--tasks", "breakout", "--algos", "ppo", "--seeds", "0,1", "--population",
            "--max-env-steps", str(STEPS)]
    assert published.main(args) == 0
    assert "seeds [0, 1]: resumed: rlstruct train ppo --resume" in capsys.readouterr().out
    for member in members:
        summary = json.loads((member / "summary.json").read_text())
        assert summary["env_steps"] == STEPS and summary["stop_reason"] == "budget"
        assert published.run_state(member) == "finished"
        assert (member / "progress.csv").read_text().splitlines()[1].startswith("1,8192,")
    assert published.main(args) == 0
    assert capsys.readouterr().out.count("finished, skipped") == 2
