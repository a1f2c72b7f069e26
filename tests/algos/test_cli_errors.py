"""Every bad input of ``rlstruct train`` and ``rlstruct eval`` is one line on stderr and exit status 2, with nothing
started (no worker process, no log folder) and no traceback; a crashed worker with ``--restart-workers`` is replaced
and the run still learns."""

from __future__ import annotations

import ast
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlstruct.algos import a2c, load
from rlstruct.algos._train.checkpoints import content_digest
from rlstruct.algos._train.cli import main
from rlstruct.algos._train.flags import OneLineParser
from rlstruct.algos._train.session import validate
from rlstruct.algos.a2c import A2CConfig
from rlstruct.errors import CheckpointError
from tests.helpers import train_with_a_worker_killed


def run_cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    """``rlstruct ARGV`` in this process: its exit status and its stderr lines."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own exits
        code = e.code
    err = capsys.readouterr().err
    return code, err.splitlines()


def assert_one_line_error(code: int, lines: list[str], prog: str) -> None:
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{prog}: error: "), lines
    assert "Traceback" not in lines[0]


@pytest.fixture
def no_new_processes():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before, f"processes left or started: {after - before}"


@pytest.mark.parametrize(("flags", "match"), [
    (["--logdir", "/proc/x"], "logdir must be a folder this process can create and write, got '/proc/x'"),
    (["--env", "Cartpole-v1"], "did you mean 'CartPole-v1'"),
    (["--env", "CartPol-v1"], "did you mean 'CartPole-v1'"),
    (["--lr", "abc"], "argument --lr: invalid float value: 'abc'"),
    (["--n-envs", "0"], "n_envs must be >= 1, got 0"),
    (["--restart-workers", "-1"], "restart_workers must be >= 0, got -1"),
    (["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag 1"),
])
def test_a_bad_flag_is_one_line_and_status_2(flags, match, capsys, tmp_path, no_new_processes):
    code, lines = run_cli(["train", "a2c", "--logdir", str(tmp_path / "run"), "--max-env-steps", "64", *flags],
                          capsys)
    assert_one_line_error(code, lines, "rlstruct train a2c")
    assert match in lines[0]
    if "--logdir" not in flags:
        assert not (tmp_path / "run").exists(), "a run that fails its checks creates no log folder"


@pytest.mark.parametrize(("argv", "prog", "match"), [
    (["train", "a2c", "--max-env", "3000"], "rlstruct train a2c",
     "unrecognized arguments: --max-env 3000; did you mean --max-env-steps?"),
    (["train", "a2c", "--max-env=3000"], "rlstruct train a2c", "did you mean --max-env-steps?"),
    (["train", "ppo", "--lerning-rate", "1e-3"], "rlstruct train ppo", "unrecognized arguments: --lerning-rate"),
    (["eval", "x.pt", "--episode", "3"], "rlstruct eval", "did you mean --episodes?"),
])
def test_a_prefix_of_a_flag_is_not_taken_for_it_and_the_error_names_the_flag(argv, prog, match, capsys, tmp_path,
                                                                           no_new_processes):
    code, lines = run_cli([*argv, *(["--logdir", str(tmp_path / "run")] if argv[0] == "train" else [])], capsys)
    assert_one_line_error(code, lines, prog)
    assert match in lines[0], "argparse's prefix matching is off and the close flag is suggested"
    assert not (tmp_path / "run").exists(), "a command line with an unknown flag starts no run"


@pytest.mark.slow  # 1.9 CPU s on the reference CPU: slow is 1.5 s or more
def test_every_argument_parser_of_the_project_turns_prefix_matching_off():
    """The library's parsers are :class:`OneLineParser` (``allow_abbrev=False``); every other ``ArgumentParser`` the
    repository builds (the benchmarks') passes ``allow_abbrev=False`` itself."""
    root = Path(__file__).resolve().parents[2]
    plain, library = [], 0
    for folder in ("rlstruct", "agents", "batchers", "algos", "benchmarks", "tutorials"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                library += name == "OneLineParser"
                if name == "ArgumentParser" and not any(
                        k.arg == "allow_abbrev" and getattr(k.value, "value", None) is False for k in node.keywords):
                    plain.append(f"{path.relative_to(root)}:{node.lineno}")
    assert plain == [], "argparse's prefix matching is on in these parsers"
    assert library >= 3 and OneLineParser(prog="x").allow_abbrev is False


#: ``rlstruct ARGV`` for each ARGV of a JSON list, in an interpreter that cannot import scipy from its start, as
#: where the stats extra is missing; prints each status
WITHOUT_SCIPY = """
import json, sys
class NoScipy:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "scipy":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoScipy())
from rlstruct.algos._train.cli import main
for argv in json.loads(sys.argv[1]):
    print(main(argv))
"""


@pytest.mark.slow  # 3.4 CPU s on the reference CPU: slow is 1.5 s or more
def test_compare_without_the_stats_extra_says_how_to_install_it_in_one_line(tmp_path):
    """In a fresh process, so that an import of scipy at any module's import is caught too; beside the statistics'
    tests, which skip without scipy. The report, which draws the same statistics, says the same line. Both run in
    one process: a module whose import imports scipy fails and is not kept, so the second command meets it again."""
    for seed, score in enumerate((500.0, 480.0)):
        run = tmp_path / "group" / f"seed-{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"eval_return": score, "env_steps": 100}))
        (run / "config.json").write_text(json.dumps({"algo": "ppo", "env": "CartPole-v1", "seed": seed}))
    commands = [["report", str(tmp_path / "group"), "--output", "report.html"], ["compare", str(tmp_path / "group")]]
    done = subprocess.run([sys.executable, "-c", WITHOUT_SCIPY, json.dumps(commands)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.split() == ["2", "2"], done.stderr
    assert done.stderr.splitlines() == [
        f"rlstruct {command}: error: rlstruct compare, rlstruct report and rlstruct.algos.statistics need scipy, "
        "which is not installed here; pip install 'rlstruct[stats]'" for command in ("report", "compare")]
    assert not (tmp_path / "report.html").exists()


def test_a_logdir_under_a_file_is_refused_before_anything_starts(tmp_path, capsys, no_new_processes):
    (tmp_path / "file").write_text("")
    code, lines = run_cli(["train", "ppo", "--logdir", str(tmp_path / "file" / "run"), "--n-processes", "2"], capsys)
    assert_one_line_error(code, lines, "rlstruct train ppo")
    assert "pass --logdir a writable folder" in lines[0]


#: (flag, strategy of values the flag refuses) for the settings every algorithm shares, and A2C's own
BAD_VALUES = {
    "--n-envs": st.integers(max_value=0),
    "--n-evaluation-envs": st.integers(max_value=0),
    "--eval-every": st.integers(max_value=0),
    "--log-every": st.integers(max_value=0),
    "--evaluation-chunk-steps": st.integers(max_value=0),
    "--max-env-steps": st.integers(max_value=0),
    "--n-processes": st.integers(max_value=-1),
    "--n-evaluation-processes": st.integers(max_value=-1),
    "--checkpoint-every": st.integers(max_value=-1),
    "--restart-workers": st.integers(max_value=-1),
    "--seed": st.one_of(st.integers(max_value=-1), st.integers(min_value=2**31)),
    "--lr": st.one_of(st.floats(max_value=0.0), st.just(float("nan"))),
    "--time-limit": st.floats(max_value=0.0),
    "--batcher-timeout": st.floats(max_value=0.0),
    "--start-timeout": st.floats(max_value=0.0),
    "--hidden-sizes": st.integers(max_value=0),
    "--backend": st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12).filter(
        lambda s: s not in ("auto", "torch", "gymnasium", "envpool", "ale", "gymnax", "mjx", "mujoco_torch", "brax")),
    "--matmul-precision": st.sampled_from(["low", "float16", "HIGH", ""]),
    "--physics-dtype": st.sampled_from(["float16", "double", "fp32"]),
    "--learner-device": st.sampled_from(["cuda:7", "tpu", "gpu", "cpu:x", "mps:3"]),
    "--n-steps": st.integers(max_value=0),
    "--gamma": st.one_of(st.floats(max_value=-1e-6), st.floats(min_value=1.000001, allow_infinity=True)),
    "--gae-lambda": st.one_of(st.floats(max_value=-1e-6), st.floats(min_value=1.000001)),
}
#: text no numeric flag parses
NOT_A_NUMBER = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_ ", min_size=1, max_size=8).filter(
    lambda s: s.strip() and s.strip().lower() not in ("inf", "nan", "infinity", "none") and not s.startswith("-"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(sorted(BAD_VALUES)), data=st.data())
def test_generated_bad_values_of_train_are_one_line_and_status_2(flag, data, capsys, tmp_path):
    numeric = flag not in ("--backend", "--matmul-precision", "--physics-dtype", "--learner-device")
    values = st.one_of(BAD_VALUES[flag].map(str), NOT_A_NUMBER) if numeric else BAD_VALUES[flag]
    value = data.draw(values, label="value")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    logdir = tmp_path / f"run-{abs(hash((flag, value)))}"
    code, lines = run_cli(["train", "a2c", "--logdir", str(logdir), f"{flag}={value}"], capsys)
    assert_one_line_error(code, lines, "rlstruct train a2c")
    assert not logdir.exists()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


@pytest.fixture
def checkpoint(tiny_cartpole_run) -> Path:
    return tiny_cartpole_run / "checkpoint.pt"


def _damaged(checkpoint: Path, tmp_path: Path, how: str) -> Path:
    data = torch.load(checkpoint, weights_only=True)
    if how == "no config":
        del data["config"]
    elif how == "no model":
        del data["model"]
    elif how == "no env in its config":
        data["config"] = {k: v for k, v in data["config"].items() if k != "env"}
    elif how == "other shapes":
        data["model"] = {k: v[..., :1] if v.ndim else v for k, v in data["model"].items()}
    elif how == "a missing tensor":
        data["model"] = dict(list(data["model"].items())[1:])
    elif how == "another algorithm's model":
        data["algo"] = data["algorithm"] = "dqn"
    data["digest"] = content_digest(data)  # written whole, by code that left it inconsistent
    path = tmp_path / "damaged.pt"
    torch.save(data, path)
    return path


@pytest.mark.slow  # 4.3 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.parametrize(("how", "match"), [
    ("no config", "damaged rlstruct checkpoint: it lacks config"),
    ("no model", "damaged rlstruct checkpoint: it lacks model"),
    ("no env in its config", "lacks config['env']"),
    ("other shapes", "holds weights that do not fit the network its config describes"),
    ("a missing tensor", "holds weights that do not fit the network its config describes"),
    ("another algorithm's model", "holds weights that do not fit the network its config describes"),
])
def test_eval_of_a_damaged_checkpoint_is_one_line_and_status_2(checkpoint, how, match, tmp_path, capsys,
                                                                no_new_processes):
    code, lines = run_cli(["eval", str(_damaged(checkpoint, tmp_path, how)), "--n-processes", "2"], capsys)
    assert_one_line_error(code, lines, "rlstruct eval")
    assert match in lines[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(["--episodes", "--max-steps", "--video-episodes", "--seed", "--n-processes"]),
       value=st.one_of(st.integers(max_value=-1).map(str), NOT_A_NUMBER))
def test_generated_bad_values_of_eval_are_one_line_and_status_2(checkpoint, flag, value, capsys):
    code, lines = run_cli(["eval", str(checkpoint), f"{flag}={value}"], capsys)
    assert_one_line_error(code, lines, "rlstruct eval")


def _no_checkpoint(tmp_path: Path, how: str, monkeypatch) -> Path:
    path = tmp_path / ("nowhere" if how == "missing" else "checkpoint.pt")
    if how == "a folder without one":
        path = tmp_path / "folder"
        path.mkdir()
    elif how == "unreadable":  # the tests may run as root, whom file permissions do not stop
        path.write_bytes(b"")

        def refused(*args, **kwargs):
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(torch, "load", refused)
    elif how == "not a checkpoint":
        path.write_text("notes")
    return path


@pytest.mark.parametrize(("how", "match"), [
    ("missing", "does not exist; pass the checkpoint.pt of an earlier run, or its log folder"),
    ("a folder without one", "is a folder without a checkpoint.pt; pass the checkpoint file"),
    ("unreadable", "cannot be read (Permission denied); pass a checkpoint.pt this process may read"),
    ("not a checkpoint", "is not an rlstruct checkpoint (torch.load cannot read it: "),
])
def test_a_missing_or_unreadable_checkpoint_is_one_checkpoint_error_everywhere(how, match, tmp_path, monkeypatch,
                                                                              capsys, no_new_processes):
    """``rlstruct.algos.load``, ``train(resume=...)``, ``rlstruct eval`` and ``rlstruct train --resume``: one type in
    Python, one line and status 2 on the command line, each naming its argument, the path and the fix."""
    path = _no_checkpoint(tmp_path, how, monkeypatch)
    with pytest.raises(CheckpointError, match=re.escape(f"run_or_checkpoint={str(path)!r} {match}")):
        load(path)
    with pytest.raises(CheckpointError, match=re.escape(f"resume={str(path)!r} {match}")):
        validate(a2c.ALGORITHM, A2CConfig(resume=str(path), logdir=str(tmp_path / "run")))
    code, lines = run_cli(["eval", str(path)], capsys)
    assert_one_line_error(code, lines, "rlstruct eval")
    assert f"checkpoint={str(path)!r} {match}" in lines[0]
    code, lines = run_cli(["train", "a2c", "--resume", str(path), "--logdir", str(tmp_path / "run")], capsys)
    assert_one_line_error(code, lines, "rlstruct train a2c")
    assert f"resume={str(path)!r} {match}" in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("how", ["other shapes", "a missing tensor"])
def test_resuming_a_damaged_checkpoint_is_one_line_and_status_2(checkpoint, how, tmp_path, capsys):
    damaged = _damaged(checkpoint, tmp_path, how)
    code, lines = run_cli(["train", "a2c", "--resume", str(damaged), "--max-env-steps", "4096", "--no-progress",
                           "--logdir", str(tmp_path / "resumed")], capsys)
    assert_one_line_error(code, lines, "rlstruct train a2c")
    assert "the model in the checkpoint does not fit this run's" in lines[0]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_worker_sigkilled_with_no_restart_left_ends_the_run_like_a_signal_and_resume_continues_it(tmp_path,
                                                                                                   capsys):
    """The learner in the parent outlives its training worker (``--restart-workers 0``, the worker SIGKILLed while
    the run trains): the run stops with its checkpoint and its summary (``stop_reason`` ``"worker_failed"``, the
    worker and the error's line), one line on stderr and status 1, where it ended in a traceback with neither; and
    ``--resume`` continues from that checkpoint. The killed run is forked from this process and started as a fresh one
    (``tests.helpers.ForkedCommand``: its own fork server, whose child the worker is); the resume is the command in
    this process."""
    logdir = tmp_path / "run"
    flags = ["--env", "CartPole-v1", "--n-envs", "4", "--n-steps", "8", "--n-evaluation-envs", "2",
             "--eval-every", "10", "--no-stop-at-reward-threshold", "--log-every", "1", "--no-progress",
             "--no-tensorboard"]
    killed, run = train_with_a_worker_killed(
        ["train", "a2c", *flags, "--n-processes", "1", "--restart-workers", "0", "--max-env-steps",
         "100000000", "--time-limit", "240", "--logdir", str(logdir)], logdir, after_rows=3, timeout=240)
    assert killed is not None, "the run ended before its worker could be killed"
    assert run.returncode == 1, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr[-3000:]
    assert re.fullmatch(rf"rlstruct train a2c: error: worker 0 \(pid {killed}\) was killed by SIGKILL .*; the run "
                        rf"stopped and wrote {re.escape(str(logdir / 'checkpoint.pt'))} and its summary: continue it "
                        rf"with --resume {re.escape(str(logdir))} .*", lines[0]), lines[0]
    summary = json.loads((logdir / "summary.json").read_text())
    assert json.loads(run.stdout.strip().splitlines()[-1]) == summary
    assert summary["stop_reason"] == "worker_failed" and summary["interrupted"] is False
    assert summary["worker_failure"]["worker_id"] == 0 and "was killed by SIGKILL" in summary["worker_failure"]["error"]
    ckpt = torch.load(logdir / "checkpoint.pt", weights_only=False)
    assert ckpt["stop_reason"] == "worker_failed" and ckpt["env_steps"] == summary["env_steps"] > 0
    with open(logdir / "progress.csv") as f:
        rows = [r for r in csv.DictReader(f) if not r.get("eval/return")]
    assert int(rows[-1]["env_steps"]) == summary["env_steps"]  # the checkpoint's counters: the last iteration's
    more = summary["env_steps"] + 2 * 4 * 8
    code, lines = run_cli(["train", "a2c", "--resume", str(logdir), "--max-env-steps", str(more)], capsys)
    assert code == 0, lines[-20:]
    after = json.loads((logdir / "summary.json").read_text())
    assert after["stop_reason"] == "budget" and after["env_steps"] == more and after["worker_failure"] is None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a2c_with_a_worker_sigkilled_mid_run_restarts_it_and_reaches_475(tmp_path):
    """The issue's check: ``--restart-workers 3``, one training worker SIGKILLed from outside while the run learns,
    and CartPole still reaches 475; progress.csv counts the restart. The run is forked from this process and started
    as a fresh one (``tests.helpers.ForkedCommand``: its own fork server and workers); the replacement and the
    learning are the claim, not an interpreter's start."""
    logdir = tmp_path / "run"
    killed, run = train_with_a_worker_killed(
        ["train", "a2c", "--env", "CartPole-v1", "--n-processes", "2", "--n-envs", "16", "--restart-workers",
         "3", "--max-env-steps", "500000", "--time-limit", "540", "--logdir", str(logdir), "--no-progress",
         "--no-tensorboard", "--seed", "1"], logdir, after_rows=20, timeout=540)
    out, err = run.stdout, run.stderr
    assert killed is not None, "the run ended before a worker could be killed"
    assert run.returncode == 0, err[-2000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["reached_target"], summary
    with open(logdir / "progress.csv") as f:
        restarts = [float(r["batcher/restarts"]) for r in csv.DictReader(f) if r.get("batcher/restarts")]
    assert restarts[0] == 0 and restarts[-1] >= 1, restarts[-5:]
    assert "restart" in err.lower()
