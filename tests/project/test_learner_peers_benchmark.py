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
import sys
from pathlib import Path

import pytest

from tests.helpers import wall_limit
from tests.project.forked_runs import fork_the_configurations

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "learner_peers.py"


def _main_here(script, argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               capsys: pytest.CaptureFixture[str]) -> str:
    """``python benchmarks/SCRIPT ARGV``'s parent in this process (``script``: its module), in ``tmp_path``: what it
    printed. Each configuration still runs in a process of its own (``python SCRIPT --one NAME``, with the variables
    the parent sets, which are this process's again afterwards), forked from this one and started as a fresh one
    (``tests.project.forked_runs``); the parent only starts them and prints the table, and a fresh interpreter would
    import torch again to say which machine it ran on, or before a configuration starts (2-3 CPU s each). That
    ``python SCRIPT --one NAME`` runs as a command of its own is the DQN comparison's, whose live run is one."""
    monkeypatch.chdir(tmp_path)
    fork_the_configurations(script, tmp_path / "forked", monkeypatch)
    monkeypatch.setattr(sys, "argv", [str(script.__file__), *argv])
    for name, value in (("OMP_NUM_THREADS", "1"), ("RLSTRUCT_JIT_AFTER", "0")):  # what the parent sets by default
        monkeypatch.setenv(name, os.environ.get(name, value))
    capsys.readouterr()
    script.main()
    return capsys.readouterr().out


def _run(only: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
         *extra: str) -> str:
    """The configurations ``only`` at 4 envs: iterations of 512 env steps (4 envs x 128 steps, 8 minibatches of
    64), a sixteenth of the preset's: the table's rows do not depend on the size."""
    from benchmarks import learner_peers

    return _main_here(learner_peers, ["--rounds", "1", "--iterations", "1", "--warmup", "1", "--n-envs", "4",
                                      "--only", only, *extra], tmp_path, monkeypatch, capsys)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rlstruct_and_the_cleanrl_style_peer_report_their_rates_side_by_side(tmp_path, monkeypatch, capsys):
    out = _run("rlstruct-1t,cleanrl-1t", tmp_path, monkeypatch, capsys)
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
def test_rejax_reports_its_rate_and_its_compile_apart(tmp_path, monkeypatch, capsys):
    if importlib.util.find_spec("rejax") is None:
        pytest.skip("rejax is not installed (pip install rejax==0.1.3, in the 'peers' extra)")
    out = _run("rlstruct-1t,rejax-1t", tmp_path, monkeypatch, capsys, "--rejax-iterations", "1")
    row = next(line for line in out.splitlines() if line.startswith("| rejax-1t"))
    assert "start-up" in row and "of rlstruct's" in row


#: Stable-Baselines3's DQN row (``sb3-1t``) at the test's size, recorded with the command and versions that made it
SB3_DQN_ROW = Path(__file__).resolve().parents[1] / "data" / "learner_peers_dqn_sb3.json"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_dqn_comparison_runs_rlstruct_beside_stable_baselines3s_recorded_row_at_a_tiny_budget(tmp_path,
                                                                                                  monkeypatch):
    """The script's ``rlstruct-plain`` configuration end to end in its own fresh process (``--one``, as the script
    runs each configuration: the suite's one ``_fresh.run_one`` of a fresh interpreter), its row in the script's table
    beside Stable-Baselines3's, and their gradient steps' FLOPs equal with ``--no-double``. SB3's row is replayed from
    :data:`SB3_DQN_ROW`: its FLOPs a gradient step are SB3's arithmetic, which no change of rlstruct's moves, and its
    own run (a fresh process importing SB3 and building its CNN) was the costlier half of the test; record it again
    with the file's command when SB3 or the script's SB3 adapter changes. The suite's genuine SB3 run is the SAC
    comparison's, below. Double DQN's extra online forward, which the ``rlstruct`` row adds to these, is counted by
    ``tests/algos/test_dqn.py``."""
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
def test_the_sac_comparison_runs_rlstruct_and_stable_baselines3_on_hopper_at_a_tiny_budget(tmp_path, monkeypatch,
                                                                                             capsys):
    """Each learner's 16 gradient steps after 64 random env steps: rlstruct's two cycles of 8 (the first one's FLOPs
    counted, untimed; its rate over one whole cycle), SB3's 16 of one."""
    # found, not imported: only the configurations' own processes import them
    if importlib.util.find_spec("mujoco") is None:
        pytest.skip("the mujoco extra is not installed: pip install 'rlstruct[mujoco]'")
    if importlib.util.find_spec("stable_baselines3") is None:
        pytest.skip("Stable-Baselines3 is not installed")
    from benchmarks import learner_peers_sac

    out = _main_here(learner_peers_sac, ["--only", "rlstruct,sb3", "--steps", "16", "--learning-starts", "64",
                                         "--rounds", "1"], tmp_path, monkeypatch, capsys)
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert {"rlstruct", "sb3"} <= set(rows), out
    assert "of SB3's" in rows["rlstruct"]
    gflop = {name: float(re.search(r"([0-9.]+) GFLOP and", rows[name]).group(1)) for name in ("rlstruct", "sb3")}
    # The same networks and batch; SB3's actor loss also back-propagates into the critics' weights (2 x 256^3 x 2
    # multiply-adds more at 256-256), which rlstruct freezes: 0.56 against 0.64 GFLOP.
    assert gflop["rlstruct"] == pytest.approx(0.56, abs=0.005) and gflop["sb3"] == pytest.approx(0.64, abs=0.005), gflop
