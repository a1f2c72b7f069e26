"""benchmarks/learner_peers.py and its DQN and SAC companions at a tiny budget: each configuration runs in its own
process and the table compares the peers with rlstruct. Stable-Baselines3 runs for real in the SAC comparison; the DQN
comparison replays SB3's recorded row (``tests/data/learner_peers_dqn_sb3.json``) beside a live rlstruct run."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import wall_limit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learner_peers.py"


def _run(only: str, tmp_path: Path, *extra: str) -> str:
    """The configurations ``only`` at 16 envs: iterations of 2,048 env steps, a quarter of the preset's."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "1", "--iterations", "1", "--warmup", "1",
                           "--n-envs", "16", "--only", only, *extra], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rlstruct_and_the_cleanrl_style_peer_report_their_rates_side_by_side(tmp_path):
    out = _run("rlstruct-1t,cleanrl-1t", tmp_path)
    rows: dict[str, str] = {}  # the first table's rows (the second gives the rates per CPU second)
    for line in out.splitlines():
        if line.startswith("| "):
            rows.setdefault(line.split("|")[1].strip(), line)
    assert set(rows) >= {"rlstruct-1t", "cleanrl-1t"}, out
    assert "of rlstruct's" in rows["cleanrl-1t"] and "cores busy" in rows["rlstruct-1t"]
    assert "load average at the start" in out and "load average at the end" in out


@pytest.mark.long(reason="rejax's PPO with the CNN compiles for ~10 s and trains one 2,048-step iteration at a few "
                         "hundred env steps/s on the CPU (XLA's convolution gradients inside its scans)")
@pytest.mark.timeout(600)
def test_rejax_reports_its_rate_and_its_compile_apart(tmp_path):
    if importlib.util.find_spec("rejax") is None:
        pytest.skip("rejax is not installed (pip install rejax==0.1.3, in the 'peers' extra)")
    out = _run("rlstruct-1t,rejax-1t", tmp_path, "--rejax-iterations", "1")
    row = next(line for line in out.splitlines() if line.startswith("| rejax-1t"))
    assert "start-up" in row and "of rlstruct's" in row


#: Stable-Baselines3's DQN row (``sb3-1t``) at the test's size, recorded with the command and versions that made it
SB3_DQN_ROW = Path(__file__).resolve().parents[1] / "data" / "learner_peers_dqn_sb3.json"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_dqn_comparison_runs_rlstruct_beside_stable_baselines3s_recorded_row_at_a_tiny_budget(tmp_path,
                                                                                                  monkeypatch):
    """The script's ``rlstruct-plain`` configuration end to end in its own fresh process (``--one``, as the script
    runs each configuration), its row in the script's table beside Stable-Baselines3's, and their gradient steps'
    FLOPs equal with ``--no-double``. SB3's row is replayed from :data:`SB3_DQN_ROW`: its FLOPs a gradient step are
    SB3's arithmetic, which no change of rlstruct's moves, and its own run (a fresh process importing SB3 and building
    its CNN) was the costlier half of the test; record it again with the file's command when SB3 or the script's SB3
    adapter changes. The suite's genuine SB3 run is the SAC comparison's, below. Double DQN's extra online forward,
    which the ``rlstruct`` row adds to these, is counted by ``tests/algos/test_dqn.py``."""
    pytest.importorskip("ale_py", reason="the atari extra is not installed: pip install 'rlstruct[atari]'")
    from benchmarks import _fresh, learner_peers_dqn

    recorded = json.loads(SB3_DQN_ROW.read_text())
    size = ["--steps", "128", "--learning-starts", "128", "--buffer", "1000"]
    assert recorded["command"].endswith(" ".join(size)), "the record is of the test's size"
    monkeypatch.chdir(tmp_path)
    live = _fresh.run_one(str(SCRIPT.with_name("learner_peers_dqn.py")), "rlstruct-plain-1t", size,
                          timeout=wall_limit(240), env={**os.environ, "OMP_NUM_THREADS": "1"})
    names = ("rlstruct-plain-1t", "sb3-1t")  # float32: bfloat16 is emulated on CPUs without it
    args = argparse.Namespace(steps=128, learning_starts=128, buffer=1000, only=",".join(names))
    table = io.StringIO()
    with contextlib.redirect_stdout(table):
        _fresh.print_results({"rlstruct-plain-1t": [live], "sb3-1t": [recorded["result"]]},
                             learner_peers_dqn.configs(args), "steps_per_s", "env steps/s incl. learning",
                             note=learner_peers_dqn._note)
    rows = {line.split("|")[1].strip(): line for line in table.getvalue().splitlines() if line.startswith("| ")}
    assert set(names) <= set(rows), table.getvalue()
    for name in names:  # each learner's FLOPs a gradient step and their rate on one thread
        assert "GFLOP a gradient step, gradient steps at" in rows[name], rows[name]
    gflop = {name: float(re.search(r"([0-9.]+) GFLOP a gradient step", rows[name]).group(1)) for name in names}
    # --no-double drops the online forward on the next frames: SB3's arithmetic
    assert gflop["rlstruct-plain-1t"] == pytest.approx(gflop["sb3-1t"], rel=0.02), gflop


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_sac_comparison_runs_rlstruct_and_stable_baselines3_on_hopper_at_a_tiny_budget(tmp_path):
    pytest.importorskip("mujoco", reason="the mujoco extra is not installed: pip install 'rlstruct[mujoco]'")
    pytest.importorskip("stable_baselines3", reason="Stable-Baselines3 is not installed")
    script = SCRIPT.with_name("learner_peers_sac.py")
    proc = subprocess.run([sys.executable, str(script), "--only", "rlstruct,sb3", "--steps", "64",
                           "--learning-starts", "64", "--rounds", "1"],
                          capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert {"rlstruct", "sb3"} <= set(rows), proc.stdout
    assert "of SB3's" in rows["rlstruct"]
    gflop = {name: float(re.search(r"([0-9.]+) GFLOP and", rows[name]).group(1)) for name in ("rlstruct", "sb3")}
    # The same networks and batch; SB3's actor loss also back-propagates into the critics' weights (2 x 256^3 x 2
    # multiply-adds more at 256-256), which rlstruct freezes: 0.56 against 0.64 GFLOP.
    assert gflop["rlstruct"] == pytest.approx(0.56, abs=0.005) and gflop["sb3"] == pytest.approx(0.64, abs=0.005), gflop
