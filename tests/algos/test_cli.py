"""The ``rlstruct`` command end to end (subprocesses, tiny budgets) and its parser."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
import logging
import math
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

from rlstruct.algos import a2c
from rlstruct.algos._train import cli
from rlstruct.algos._train.config import (
    OnPolicyConfig,
    RecurrentPart,
    RolloutPart,
    RunConfig,
    default,
    resume_fields,
    setting,
)
from rlstruct.algos._train.flags import build_parser, config_from_args, field_help, resumed_defaults
from rlstruct.algos._train.seeds import worker_seeds
from rlstruct.algos._train.session import validate
from rlstruct.algos.a2c import A2CConfig
from rlstruct.algos.dqn import DQNConfig
from rlstruct.algos.ppo import PPOConfig
from rlstruct.algos.pqn import PQNConfig
from rlstruct.algos.reinforce import ReinforceConfig
from rlstruct.algos.sac import SACConfig
from rlstruct.algos.td3 import TD3Config
from rlstruct.errors import ConfigError
from tests.helpers import ForkedCommand, rlstruct_in_process, wall_limit

CONFIGS = [ReinforceConfig, A2CConfig, DQNConfig, SACConfig, PPOConfig, PQNConfig, TD3Config]
#: whether the plot and tensorboard extras are installed: a run writes its learning curve and its TensorBoard events
#: with them, and warns without them
PLOT, TENSORBOARD = (importlib.util.find_spec(m) is not None for m in ("matplotlib", "tensorboard"))


def rlstruct(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    """Runs the console script's code (``python -m rlstruct.algos``) in a fresh process."""
    return subprocess.run([sys.executable, "-m", "rlstruct.algos", *args], capture_output=True, text=True,
                          timeout=timeout)


def last_json(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    return json.loads(lines[-1])


TINY = ["--no-progress", "--n-envs", "4", "--n-evaluation-envs", "2", "--max-episode-steps", "60", "--eval-every", "5"]


@pytest.mark.learning_curve
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_writes_logs_plot_checkpoint_and_eval_reads_it(tmp_path, capsys):
    """The run trains in this process (the command's own code, its output captured); ``rlstruct eval`` reads it in a
    fresh one, which proves both that another process rebuilds the run and that the command prints nothing else."""
    logdir = tmp_path / "run"
    out = rlstruct_in_process(capsys, "train", "a2c", "--env", "CartPole-v1", "--max-env-steps", "400", "--logdir",
                              str(logdir), *TINY)
    assert out.returncode == 0, out.stderr
    summary = last_json(out.stdout)
    assert {"eval_return", "env_steps", "wall_time_s", "logdir"} <= set(summary)
    assert summary["env_steps"] >= 400 and summary["logdir"] == str(logdir)
    assert 0 < summary["eval_return"] <= 60
    assert ("learning curve:" in out.stdout) == PLOT and "checkpoint:" in out.stdout
    assert not PLOT or (logdir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert bool(list(logdir.glob("events.out.tfevents.*"))) == TENSORBOARD, "TensorBoard events with its extra"
    rows = list(csv.DictReader(open(logdir / "progress.csv")))
    assert rows and {"iteration", "env_steps", "wall_time_s", "loss/policy", "eval/return"} <= set(rows[0])
    assert float(rows[-1]["eval/return"]) == pytest.approx(summary["eval_return"])
    ckpt = torch.load(logdir / "checkpoint.pt", weights_only=True)
    assert ckpt["algo"] == "a2c" and ckpt["config"]["env"] == "CartPole-v1" and ckpt["config"]["max_env_steps"] == 400
    assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in ckpt["model"].values())

    ev = rlstruct("eval", str(logdir / "checkpoint.pt"), "--episodes", "3")
    assert ev.returncode == 0, ev.stderr
    assert ev.stderr == ""  # the command's own output only: no torch or gymnasium warning
    result = last_json(ev.stdout)
    assert result["episodes"] == 3 and result["algo"] == "a2c" and 0 < result["eval_return"] <= 60
    assert "returns" not in result  # each episode's only with --returns


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["reinforce", "dqn"])
def test_train_other_algorithms_tiny(tmp_path, algo, capsys):
    """In this process: the commands' code is what is tested here, and a fresh process reading a run is
    ``test_train_writes_logs_plot_checkpoint_and_eval_reads_it``'s."""
    extra = ["--learning-starts", "50", "--gradient-steps", "2", "--rollout-steps", "4"] if algo == "dqn" else []
    out = rlstruct_in_process(capsys, "train", algo, "--max-env-steps", "300", "--logdir", str(tmp_path), *TINY,
                              *extra)
    assert out.returncode == 0, out.stderr
    summary = last_json(out.stdout)
    assert summary["env_steps"] >= 300 and (tmp_path / "checkpoint.pt").exists()
    ev = rlstruct_in_process(capsys, "eval", str(tmp_path / "checkpoint.pt"), "--episodes", "2")
    assert ev.returncode == 0, ev.stderr
    assert last_json(ev.stdout)["algo"] == algo


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_train_sac_on_pendulum_and_eval_its_checkpoint(tmp_path, capsys):
    """In this process, as ``test_train_other_algorithms_tiny``."""
    out = rlstruct_in_process(capsys, "train", "sac", "--env", "Pendulum-v1", "--max-env-steps", "400",
                              "--learning-starts", "200", "--batch-size", "32", "--hidden-sizes", "16", "16",
                              "--logdir", str(tmp_path), *TINY)
    assert out.returncode == 0, out.stderr
    summary = last_json(out.stdout)
    assert summary["env_steps"] >= 400 and -16.3 * 60 <= summary["eval_return"] <= 0
    rows = list(csv.DictReader(open(tmp_path / "progress.csv")))
    assert {"loss/critic", "loss/actor", "loss/temperature", "alpha", "eval/return"} <= set(rows[0])
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["algo"] == "sac" and "mean.weight" in ckpt["model"] and ckpt["env_spec"]["n_actions"] is None
    ev = rlstruct_in_process(capsys, "eval", str(tmp_path / "checkpoint.pt"), "--episodes", "3", "--returns")
    assert ev.returncode == 0, ev.stderr
    result = last_json(ev.stdout)
    assert result["algo"] == "sac" and result["episodes"] == 3 and -16.3 * 60 <= result["eval_return"] <= 0
    each = result["returns"]  # --returns: every episode's, whose mean, min and max are the line's
    assert len(each) == 3 and len(set(each)) == 3
    assert (min(each), max(each)) == (result["return_min"], result["return_max"])
    assert sum(each) / 3 == pytest.approx(result["eval_return"], rel=1e-6)


@pytest.mark.timeout(300)
def test_train_dqn_dueling_and_eval_rebuilds_the_dueling_network(tmp_path, capsys):
    """In this process, as ``test_train_other_algorithms_tiny``: eval rebuilds the network from the checkpoint alone,
    whichever process it runs in."""
    out = rlstruct_in_process(capsys, "train", "dqn", "--dueling", "--max-env-steps", "300", "--learning-starts", "50",
                              "--gradient-steps", "2", "--rollout-steps", "4", "--logdir", str(tmp_path), *TINY)
    assert out.returncode == 0, out.stderr
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert ckpt["config"]["dueling"] is True and "advantage.0.weight" in ckpt["model"]
    ev = rlstruct_in_process(capsys, "eval", str(tmp_path / "checkpoint.pt"), "--episodes", "2")
    assert ev.returncode == 0, ev.stderr
    assert last_json(ev.stdout)["algo"] == "dqn"


@pytest.mark.timeout(120)
def test_a_device_that_does_not_exist_is_a_one_line_error(capsys):
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has a cuda:1")
    out = rlstruct_in_process(capsys, "train", "a2c", "--learner-device", "cuda:1", "--no-progress")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "learner_device='cuda:1' does not exist" in lines[0] and "available devices: cpu" in lines[0]
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_bad_commands_exit_2_with_one_line(capsys):
    for args, needle in [
        (["train", "trpo"], "unknown algorithm 'trpo'; expected one of ['reinforce', 'a2c', 'dqn', 'ppo', "),
        (["train", "a2c", "--env", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
        (["train", "dqn", "--n-envs", "0"], "n_envs must be >= 1"),
        (["train", "a2c", "--physics-dtype", "float16"], "physics_dtype must be 'float64' or 'float32'"),
        (["train", "a2c", "--backend", "gymnasium", "--physics-dtype", "float32"], "runs on the 'gymnasium' backend"),
        (["profile", "--physics-dtype", "float32", "--backend", "gymnasium", "--png", ""],
         "runs on the 'gymnasium' backend"),
        (["eval", "/no/such/checkpoint.pt"], "checkpoint='/no/such/checkpoint.pt' does not exist; pass the"),
        (["eval", "x.pt", "--device", "cuda:7"], "device='cuda:7' does not exist"),
        (["eval", "x.pt", "--max-steps", "0"], "max_steps must be >= 1 or None (the env's time limit), got 0"),
        (["train", "ppo", "--evaluation-chunk-steps", "0"], "evaluation_chunk_steps must be >= 1, got 0"),
        (["train", "a2c", "--seed", "-1"], "seed must be an int in [0, 2**31), got -1; pass e.g. --seed 0"),
        (["train", "sac", "--lr", "-1"], "lr must be > 0, got -1.0"),
        (["train", "dqn", "--adam-eps=-1e-5"], "adam_eps must be >= 0.0, got -1e-05"),
        (["train", "ppo", "--matmul-precision", "tf32"], "matmul_precision must be one of"),
        (["train", "a2c", "--env-kwargs", '{"no_such_argument": 1}'],
         "env_kwargs must be keyword arguments that the torch backend's constructor of 'CartPole-v1' takes, got "
         "{'no_such_argument': 1}"),
        (["eval", str(Path(__file__).parent)], "is a folder without a checkpoint.pt"),
        (["eval", __file__], "is not an rlstruct checkpoint (torch.load cannot read it"),
    ]:
        assert cli.main(args) == 2, args
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and needle in err, (args, err)


def test_a_dict_flag_takes_a_json_object(capsys):
    for text, needle in [
        ("episodic_life=true", "argument --env-kwargs: must be a JSON object such as '{\"episodic_life\": true}' "
                               "(quoted for the shell), or none; got 'episodic_life=true' (Expecting value"),
        ("[1]", "must be a JSON object such as '{\"episodic_life\": true}' (quoted for the shell), or none; got "
                "'[1]', a JSON list"),
    ]:
        with pytest.raises(SystemExit) as e:
            cli.main(["train", "ppo", "--env-kwargs", text])
        err = capsys.readouterr().err
        assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err


def test_train_help_lists_the_algorithms(capsys):
    for flag in ("--help", "-h"):
        assert cli.main(["train", flag]) == 0
        assert "rlstruct train {reinforce,a2c,dqn,ppo,sac,pqn,td3,impala}" in capsys.readouterr().out


def test_a_seed_past_214747_trains_with_seeds_in_range():
    """Worker seeds are seed * 10,000 + offset: they wrap into [0, 2**31) instead of failing the env's check."""
    assert worker_seeds(300_000, 2, 6000) == [(3_000_006_000 + k) % 2**31 for k in range(2)]
    assert worker_seeds(21, 2, 1000) == [211_000, 211_001]  # below the wrap: the seeds every earlier run used
    assert all(0 <= s < 2**31 for s in worker_seeds(2**31 - 1, 8, 6000))


def test_a_missing_gymnasium_dependency_is_a_missing_dependency_error():
    pytest.importorskip("gymnasium")
    try:
        import Box2D  # noqa: F401
        pytest.skip("Box2D is installed here")
    except ImportError:
        pass
    from rlstruct.envs import make_env
    from rlstruct.errors import MissingDependencyError

    with pytest.raises(MissingDependencyError, match="env 'LunarLander-v3' needs a package that is not installed"):
        make_env("LunarLander-v3", 1, backend="gymnasium")


def test_module_entry_point_prints_help(monkeypatch, capsys):
    """``python -m rlstruct.algos.dqn --help``: the module run as ``__main__`` (what ``-m`` does), in this process; a
    fresh interpreter would spend seconds importing torch to print the help (the console script's fresh process is
    ``test_summary_times_the_launch_to_the_first_iteration_and_to_the_target``'s)."""
    monkeypatch.setattr(sys, "argv", ["rlstruct.algos.dqn", "--help"])
    with warnings.catch_warnings():  # the module is imported already, as the package imports it: runpy says so
        warnings.filterwarnings("ignore", "'rlstruct.algos.dqn' found in sys.modules", RuntimeWarning)
        with pytest.raises(SystemExit) as done:
            runpy.run_module("rlstruct.algos.dqn", run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code == 0 and "--learner-device" in out and "--epsilon-decay-steps" in out


@pytest.mark.parametrize("algo", ["reinforce", "a2c", "dqn", "sac", "ppo", "td3"])
def test_train_help_lists_the_flags(algo, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", algo, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--env", "--backend", "--n-envs", "--n-processes", "--learner-device", "--batcher-device",
                 "--evaluation-device", "--seed", "--time-limit", "--max-env-steps", "--logdir", "--no-progress"):
        assert flag in out


# --------------------------------------------------------------------------- parser from the dataclasses
@pytest.mark.parametrize("config_cls", CONFIGS)
def test_every_config_field_has_a_plain_help_beside_it_and_a_flag(config_cls):
    helps = field_help(config_cls)
    parser = build_parser(config_cls, "prog")
    flags = {a.dest: a for a in parser._actions}
    for f in dataclasses.fields(config_cls):
        text, group = helps[f.name]
        assert text and flags[f.name].help == text, f.name
        assert not any(mark in text for mark in (":mod:", ":func:", ":class:", "``", "...")), (f.name, text)
    for name in ("env", "backend", "n_envs", "n_processes", "learner_device", "batcher_device", "evaluation_device",
                 "seed", "time_limit", "max_env_steps", "logdir", "progress"):
        assert helps[name][1] in ("environment", "run", "evaluation")


def test_a_field_an_algorithm_re_declares_keeps_its_group_and_says_so_in_its_own_help():
    @dataclasses.dataclass
    class Config(OnPolicyConfig):
        lr: float = setting(1e-2, "Adam learning rate (this algorithm: 1e-2)")
        wide_field: float = setting(1.0, "a setting of its own")

    helps = field_help(Config)
    assert helps["lr"] == ("Adam learning rate (this algorithm: 1e-2)", "run")
    assert helps["wide_field"] == ("a setting of its own", "algorithm")
    assert helps["gamma"][1] == "on-policy" and helps["autocast"][1] == "fast path"
    assert field_help(RunConfig)["lr"] == ("Adam learning rate", "run")


def test_a_default_changed_with_default_keeps_the_fields_help_and_group():
    @dataclasses.dataclass
    class Config(RolloutPart, OnPolicyConfig):
        n_steps: int = default(64)
        lr: float = default(1e-2)

    helps, base = field_help(Config), field_help(RolloutPart)
    assert Config().n_steps == 64 and Config().lr == 1e-2
    assert helps["n_steps"] == base["n_steps"] == ("steps of every env per collection (auto-reset envs)", "on-policy")
    assert helps["lr"] == ("Adam learning rate", "run")
    assert "steps of every env per collection (auto-reset envs) (default: 64)" in " ".join(
        build_parser(Config, "prog").format_help().split())


def test_each_algorithm_takes_only_the_parts_its_loop_reads():
    names = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (ReinforceConfig, PQNConfig, A2CConfig)}
    # REINFORCE collects whole episodes with a feed-forward actor-critic: no collection part, no LSTM
    assert not {"n_steps", "overlap", "cuda_graph", "recurrent"} & names[ReinforceConfig]
    assert {"normalize_observations", "compile_policy", "compile_update", "autocast"} <= names[ReinforceConfig]
    # PQN's Q-network is no actor-critic: no observation normaliser, no LSTM, no compiled policy
    assert not {"recurrent", "normalize_observations", "compile_policy"} & names[PQNConfig]
    assert {"n_steps", "overlap", "cuda_graph", "compile_update"} <= names[PQNConfig]
    assert {"n_steps", "overlap", "cuda_graph", "recurrent", "normalize_observations"} <= names[A2CConfig]
    assert issubclass(PPOConfig, RolloutPart) and issubclass(PPOConfig, RecurrentPart)
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_steps'"):
        ReinforceConfig(n_steps=8)


@pytest.mark.parametrize("algo, flag", [("reinforce", "--n-steps"), ("reinforce", "--recurrent"),
                                        ("reinforce", "--overlap"), ("pqn", "--recurrent"),
                                        ("pqn", "--normalize-observations"), ("pqn", "--compile-policy")])
def test_a_flag_an_algorithm_does_not_take_is_an_unknown_flag(algo, flag, capsys):
    args = [flag, "4"] if flag == "--n-steps" else [flag]
    with pytest.raises(SystemExit) as e:
        cli.main(["train", algo, *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"rlstruct train {algo}: error: unrecognized arguments: {' '.join(args)}" in err
    assert f"(rlstruct train {algo} --help lists the flags)" in err


def test_n_envs_means_the_runs_envs_in_all_in_every_algorithms_help():
    for config_cls in CONFIGS:
        assert field_help(config_cls)["n_envs"][0] == field_help(RunConfig)["n_envs"][0], config_cls.__name__
    assert "in all" in field_help(ReinforceConfig)["n_envs"][0]


def test_the_settings_a_resumed_run_shares_come_from_its_family_its_parts_and_its_own():
    assert resume_fields(ReinforceConfig) == (*RunConfig.RESUME_FIELDS, "normalize_rewards", "activation",
                                              "normalize_observations")
    assert set(resume_fields(PPOConfig)) == {*RunConfig.RESUME_FIELDS, "normalize_rewards", "activation",
                                             "normalize_observations", "recurrent"}
    assert resume_fields(PQNConfig)[-2:] == ("layer_norm", "activation") and "recurrent" not in resume_fields(PQNConfig)
    assert resume_fields(DQNConfig)[-1] == "dueling"


def test_a_checkpoint_saved_with_the_settings_a_config_no_longer_has_still_resumes_its_settings():
    # a REINFORCE run saved when its config still held the whole on-policy family's collection settings
    saved = {**ReinforceConfig(lr=0.01).to_dict(), "n_steps": 8, "recurrent": False, "overlap": False,
             "cuda_graph": False}
    defaults = resumed_defaults(ReinforceConfig, {"config": saved})
    assert defaults["lr"] == 0.01 and not {"n_steps", "recurrent", "overlap", "cuda_graph"} & set(defaults)
    assert ReinforceConfig(**defaults).lr == 0.01


def test_parsed_flags_build_the_config():
    parser = build_parser(DQNConfig, "prog")
    ns = parser.parse_args(["--n-envs", "3", "--hidden-sizes", "8", "8", "8", "--no-progress", "--max-env-steps",
                            "none", "--tau", "0.5", "--learner-device", "cpu"])
    cfg = config_from_args(DQNConfig, ns)
    assert cfg.n_envs == 3 and cfg.hidden_sizes == (8, 8, 8) and cfg.progress is False
    assert cfg.max_env_steps is None and cfg.tau == 0.5
    assert config_from_args(DQNConfig, parser.parse_args([])) == DQNConfig()


def test_config_to_dict_is_plain():
    d = A2CConfig().to_dict()
    assert d["hidden_sizes"] == [64, 64]
    assert all(isinstance(v, (str, int, float, bool, list, type(None))) for v in d.values())
    assert issubclass(A2CConfig, RunConfig)


def test_console_script_is_declared():
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert 'rlstruct = "rlstruct.algos._train.cli:main"' in text


def test_only_the_command_line_configures_logging():
    root = Path(__file__).resolve().parents[2]
    calling = sorted(str(p.relative_to(root)) for d in ("rlstruct", "agents", "batchers", "algos")
                     for p in (root / d).rglob("*.py") if "basicConfig(" in p.read_text())
    assert calling == ["algos/_train/train_command.py"]  # the command line's own module
    assert (root / "algos/_train/train_command.py").read_text().count("basicConfig(") == 1


# --------------------------------------------------------------------------- Ctrl-C
def _wait_for_training(run: ForkedCommand, csv_path: Path, timeout: float) -> None:
    """Waits until the run has recorded a training iteration (the CSV has a data row)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert run.poll() is None, run.stderr
        if csv_path.exists() and len(csv_path.read_text().splitlines()) >= 2:
            return
        time.sleep(0.1)
    raise AssertionError(f"no training iteration after {timeout} s")


@pytest.mark.learning_curve
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_cleanly_saves_everything_and_leaves_no_process(tmp_path, signum, capsys):
    """The run, with two workers, gets the signal as from a terminal (SIGINT to its process group) or from a
    scheduler (SIGTERM to it alone); the interrupted checkpoint is then evaluated in this process. The run is forked
    from this process and started as a fresh one (``tests.helpers.ForkedCommand``: a process group, signal handlers,
    a fork server and workers of its own): the stop, what it saves and what it leaves are the claim, not an
    interpreter's start."""
    psutil = pytest.importorskip("psutil")
    logdir = tmp_path / "run"
    # Its own process group, so that the SIGINT goes to the run's processes (as a terminal's Ctrl-C does) and
    # not to pytest's.
    run = ForkedCommand(["train", "a2c", "--n-processes", "2", "--n-envs", "8", "--max-env-steps", "100000000",
                         "--time-limit", "600", "--log-every", "1", "--no-stop-at-reward-threshold", "--logdir",
                         str(logdir), "--no-progress", "--no-tensorboard"], tmp_path / "command")
    try:
        _wait_for_training(run, logdir / "progress.csv", timeout=180)
        children = psutil.Process(run.pid).children(recursive=True)
        assert len([c for c in children if "python" in c.name().lower()]) >= 2, children  # the two workers
        sent = time.monotonic()
        if signum == signal.SIGINT:  # a terminal's Ctrl-C: the whole process group
            os.killpg(run.pid, signal.SIGINT)
        else:  # timeout, docker stop: the process
            os.kill(run.pid, signal.SIGTERM)
        run.wait(30)
        took = time.monotonic() - sent
    finally:
        run.kill()
    stdout, stderr = run.stdout, run.stderr
    assert run.returncode == 128 + signum, stderr
    print(f"stopped {took:.2f} s after the {signal.Signals(signum).name}")
    assert took < wall_limit(5.0), took  # 2 s on an idle machine; the limit scales with the machine and its load
    assert "Traceback" not in stderr, stderr
    interrupted_lines = [ln for ln in stderr.splitlines() if "interrupted" in ln]
    assert len(interrupted_lines) == 1 and "checkpoint.pt" in interrupted_lines[0], stderr
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, alive
    summary = json.loads((logdir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["env_steps"] > 0
    assert summary["stop_reason"] == "signal", "a run a signal stopped says so in summary.json"
    assert f" env steps: {signal.Signals(signum).name} received; not a result" in stdout
    assert last_json(stdout) == summary
    ckpt = torch.load(logdir / "checkpoint.pt", weights_only=True)
    assert ckpt["algo"] == "a2c" and ckpt["interrupted"] is True and ckpt["env_steps"] == summary["env_steps"]
    assert not PLOT or (logdir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader(open(logdir / "progress.csv")))
    assert int(rows[-1]["env_steps"]) == summary["env_steps"]
    ev = rlstruct_in_process(capsys, "eval", str(logdir / "checkpoint.pt"), "--episodes", "2")
    assert ev.returncode == 0, ev.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_in_python_returns_what_it_reached(tmp_path, signum):
    # A notebook's "interrupt kernel" sends SIGINT to the process, a job scheduler SIGTERM: train returns instead
    # of raising.
    # What the process had (a shell without job control starts a background job with SIGINT ignored).
    previous_int, previous_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    cfg = A2CConfig(max_env_steps=10**8, time_limit=600, progress=False, tensorboard=False, logdir=str(tmp_path),
                    stop_at_reward_threshold=False, eval_every=5, n_evaluation_envs=2, max_episode_steps=50,
                    log_every=1)
    done = threading.Event()

    def interrupt_once_training_runs() -> None:
        csv_path = tmp_path / "progress.csv"
        while not done.is_set():
            if csv_path.exists() and len(csv_path.read_text().splitlines()) >= 2:
                os.kill(os.getpid(), signum)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=interrupt_once_training_runs)
    thread.start()
    try:
        result = a2c.train(cfg)
    finally:
        done.set()
        thread.join()
    assert result.interrupted and result.env_steps > 0 and result.stop_signal == signal.Signals(signum).name
    assert math.isfinite(result.eval_return)  # the evaluations that finished before the signal
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["stop_signal"] == signal.Signals(signum).name
    assert result.stop_reason == summary["stop_reason"] == "signal", "a signal is the recorded stop reason"
    assert (tmp_path / "checkpoint.pt").exists()
    # the handlers were restored
    assert signal.getsignal(signal.SIGINT) == previous_int
    assert signal.getsignal(signal.SIGTERM) == previous_term


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_workers_start_stops_the_run_after_the_start(tmp_path, monkeypatch, capsys, signum):
    """A Ctrl-C (or SIGTERM) that arrives while a worker process is being started (here: inside the training
    worker's ``Process.start``, where the batcher holds the signals so that the worker cannot die of them) is acted
    on once the workers are up: nothing is trained, the start gives its folder back, and the command ends as for a
    signal before the start (130 and one line; 143 for SIGTERM), instead of training to its end with status 0."""
    import multiprocessing.process

    real_start = multiprocessing.process.BaseProcess.start
    sent = []

    def start_with_a_signal(process) -> None:
        if not sent and process.name.startswith("rlstruct-worker"):
            sent.append(process.name)
            os.kill(os.getpid(), signum)
        real_start(process)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start_with_a_signal)
    logdir = tmp_path / "run"
    argv = ["train", "a2c", "--n-processes", "1", "--n-envs", "2", "--max-env-steps", "20000", "--eval-every", "50",
            "--n-evaluation-envs", "2", "--no-stop-at-reward-threshold", "--logdir", str(logdir), "--no-progress",
            "--no-tensorboard"]
    previous = signal.getsignal(signum)
    capsys.readouterr()
    if signum == signal.SIGINT:
        assert cli.main(argv) == 130
        err = capsys.readouterr().err
        assert err.splitlines() == ["rlstruct train a2c: interrupted: stopped without writing a checkpoint"], err
    else:
        with pytest.raises(SystemExit) as stopped:
            cli.main(argv)
        assert stopped.value.code == 143
    assert sent == ["rlstruct-worker-0"]
    assert not logdir.exists(), "a start stopped before training gives its folder back"
    assert signal.getsignal(signum) == previous


@pytest.mark.timeout(120)
def test_a_run_without_iterations_is_warned_about_and_a_second_run_never_replaces_the_first(tmp_path, caplog):
    logdir = tmp_path / "run"
    cfg = dict(progress=False, tensorboard=True, logdir=str(logdir), n_evaluation_envs=2, max_episode_steps=20)
    with caplog.at_level(logging.WARNING, logger="rlstruct.algos"):
        first = a2c.train(A2CConfig(time_limit=1e-6, **cfg))
    assert "no training iteration ran: the time limit (1e-06 s) was spent" in caplog.text
    assert first.logdir == str(logdir) and "holds an earlier run" not in caplog.text
    files = {p.name: p.read_bytes() for p in logdir.iterdir()}
    assert {"config.json", "progress.csv", "checkpoint.pt", "summary.json"} <= set(files)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlstruct.algos"):
        second = a2c.train(A2CConfig(max_env_steps=64, **cfg))
    assert second.iterations > 0 and "no training iteration" not in caplog.text
    assert second.logdir == f"{logdir}-2" and second.checkpoint == f"{logdir}-2/checkpoint.pt"
    assert f"{logdir} holds an earlier run (checkpoint.pt, config.json, " in caplog.text
    assert f"this run writes to {logdir}-2 (--resume {logdir} continues that one)" in caplog.text
    assert {p.name: p.read_bytes() for p in logdir.iterdir()} == files, "the first run's files are left alone"
    assert json.loads((Path(second.logdir) / "config.json").read_text())["logdir"] == second.logdir


def test_runs_started_into_one_logdir_each_claim_their_own_folder(tmp_path):
    from rlstruct.algos._train.folder_claim import claim_logdir

    assert claim_logdir(tmp_path) == tmp_path, "an empty folder is a new run's"
    claimed = [claim_logdir(tmp_path / "sweep") for _ in range(3)]
    assert claimed == [tmp_path / "sweep", tmp_path / "sweep-2", tmp_path / "sweep-3"]
    (tmp_path / "sweep-2" / "config.json").unlink()
    (tmp_path / "sweep-2" / "events.out.tfevents.1.host").write_bytes(b"")
    assert claim_logdir(tmp_path / "sweep") == tmp_path / "sweep-4", "TensorBoard events are a run's too"
    with pytest.raises(ConfigError, match=r"logdir='.*sweep' holds an earlier run \(config.json\), which a new run "
                                          r"would replace; pass a new --logdir, or --resume .*sweep to continue"):
        claim_logdir(tmp_path / "sweep", numbered=False)


def test_a_torchrun_launch_refuses_a_used_logdir_and_its_restarts_reuse_their_own(tmp_path, monkeypatch, capsys):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert cli.main(["train", "a2c", "--logdir", str(tmp_path), "--max-env-steps", "64", "--no-progress"]) == 2
    assert "holds an earlier run (config.json), which a new run would replace" in capsys.readouterr().err
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a restart with no checkpoint to resume starts over
    setup = validate(a2c.ALGORITHM, A2CConfig(logdir=str(tmp_path), max_env_steps=64))
    assert setup.config.logdir == str(tmp_path)


@pytest.mark.parametrize("algo", ["reinforce", "a2c", "dqn", "sac", "ppo", "td3"])
def test_train_help_is_grouped_and_each_entry_is_two_lines_at_most(algo, capsys):
    from rlstruct.algos._train.flags import HELP_POSITION

    with pytest.raises(SystemExit):
        cli.main(["train", algo, "--help"])
    out = capsys.readouterr().out
    title = {"reinforce": "REINFORCE"}.get(algo, algo.upper())
    groups = ["environment:", "run:", "evaluation:", "checkpoints:", f"{title}'s own settings:"]
    if algo in ("reinforce", "a2c", "ppo"):
        groups += ["on-policy:", "fast path:", "normalisation:"]
    else:
        groups += ["off-policy:"]
    lines = out.splitlines()
    assert [g for g in groups if g not in lines] == []
    entries: list[list[str]] = []
    for line in lines[lines.index("options:") + 1:]:
        if line.startswith("  -"):
            entries.append([line])
        elif line.startswith(" " * HELP_POSITION) and entries:
            entries[-1].append(line)
        else:  # a group's title, a blank line or the epilog
            entries.append([]) if entries and entries[-1] else None
    entries = [e for e in entries if e]
    assert len(entries) >= 40
    for entry in entries:
        first = entry[0]
        help_on_first = len(first) > HELP_POSITION and first[HELP_POSITION - 2:HELP_POSITION] == "  "
        assert help_on_first + len(entry) - 1 <= 2, entry
        assert help_on_first or len(entry) > 1, entry  # every flag has a help text


@pytest.mark.slow
def test_summary_times_the_launch_to_the_first_iteration_and_to_the_target(tmp_path, capsys):
    # A low target, reached within a few thousand steps; the clock starts at the process's start (imports included),
    # so this run is a fresh process. The run that misses its target reports no time to it, in this process.
    out = rlstruct("train", "ppo", "--env", "CartPole-v1", "--target-return", "60", "--n-envs", "8", "--eval-every",
                   "2", "--logdir", str(tmp_path / "reached"), "--no-tensorboard", *TINY)
    assert out.returncode == 0, out.stderr
    summary = last_json(out.stdout)
    assert summary["reached_target"] and summary["eval_return"] >= 60
    assert summary["stop_reason"] == "target", "a run that reached its target says so in summary.json"
    # One story: the stop line, the return line and the summary name the same weights and the same number.
    at = f"{summary['eval_env_steps']:,}"
    assert 0 < summary["eval_env_steps"] <= summary["env_steps"]
    assert (f"stopped: the weights taken at {at} env steps reached the target return 60 in an evaluation and in its "
            "confirmation on ") in out.stdout
    assert (f"evaluation return {summary['eval_return']:.2f} (the confirmation of the weights taken at {at} env "
            f"steps) after {summary['env_steps']:,} env steps") in out.stdout
    assert ": at or above the target 60" in out.stdout
    # torch's import alone takes longer than 0.3 s on any machine this runs on.
    assert 0.3 < summary["startup_s"] < summary["time_to_target_s"] <= summary["wall_time_s"]
    assert json.loads((tmp_path / "reached" / "summary.json").read_text())["time_to_target_s"] == summary[
        "time_to_target_s"]
    missed = rlstruct_in_process(capsys, "train", "a2c", "--env", "CartPole-v1", "--max-env-steps", "400", "--logdir",
                                 str(tmp_path / "missed"), *TINY)
    summary = last_json(missed.stdout)
    assert not summary["reached_target"] and summary["time_to_target_s"] is None and summary["startup_s"] > 0
    assert summary["stop_reason"] == "budget", "a run that spent --max-env-steps says so in summary.json"
    assert json.loads((tmp_path / "missed" / "summary.json").read_text())["stop_reason"] == "budget"
    assert "stopped: the budget of 400 env steps was spent" in missed.stdout
    assert summary["eval_env_steps"] == summary["env_steps"] and summary["target_return"] == 475.0
    assert f"final evaluation return {summary['eval_return']:.2f} after " in missed.stdout
    assert ": below the target 475" in missed.stdout


def test_a_run_stopped_by_the_time_limit_says_so_and_no_tensorboard_hint_without_it(tmp_path, capsys):
    assert cli.main(["train", "a2c", "--env", "CartPole-v1", "--max-env-steps", "100000000", "--time-limit", "0.5",
                     "--no-stop-at-reward-threshold", "--no-tensorboard", "--logdir", str(tmp_path), *TINY]) == 0
    out = capsys.readouterr().out
    summary = last_json(out)
    assert summary["stop_reason"] == "time_limit", "a run ended by --time-limit says so in summary.json"
    assert json.loads((tmp_path / "summary.json").read_text())["stop_reason"] == "time_limit"
    assert "stopped at " in out and " of 100,000,000 env steps: time limit of 0.5 s reached; not a result" in out
    assert summary["stopped_early"].endswith(" of 100,000,000 env steps (its time limit)")
    assert "TensorBoard" not in out, "--no-tensorboard prints no TensorBoard command"


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the new process is a fork of this one")
def test_launched_at_is_the_process_start():
    """In a new process, a child forked from this one (a fresh interpreter would spend seconds importing torch to
    read the same clock): 0.6 s after its start, its ``launched_at()`` lies at least half a second back (the
    process's start is read in clock ticks)."""
    from rlstruct.algos._train.train_command import launched_at

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            time.sleep(0.6)
            os.write(write, repr(time.perf_counter() - launched_at()).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        age = float(os.read(read, 64))
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert 0.5 <= age < 60
    assert time.perf_counter() - launched_at() > 0


def test_a_command_called_from_python_is_timed_from_the_call_not_the_process_start(tmp_path, capsys):
    from rlstruct.algos._train.train_command import launched_at

    time.sleep(1.0)  # the process is older than the call by at least this much
    age = time.perf_counter() - launched_at()
    assert cli.main(["train", "a2c", "--env", "CartPole-v1", "--max-env-steps", "256", "--logdir", str(tmp_path),
                     *TINY]) == 0
    summary = last_json(capsys.readouterr().out)
    assert summary["iterations"] >= 1 and summary["startup_s"] < age
