"""``--deterministic``: two runs of one seed give the same bits (their progress rows and their weights) for A2C, PPO
and DQN; the run turns torch's deterministic mode on, for its own process and its worker processes, and restores the
settings after; what cannot be deterministic is refused in one line. On the CPU; the same runs on a GPU are a step of
``benchmarks/gpu_suite.sh``."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlstruct import _accel, _determinism
from rlstruct._determinism import (
    CUBLAS_WORKSPACE_ENV,
    DETERMINISTIC_ENV,
    check_cublas_workspace,
    deterministic_mode,
)
from rlstruct.algos import A2CConfig, a2c, ppo
from rlstruct.algos._train import cli, entry, loops, session, train_command
from rlstruct.batchers import RL_Batcher
from rlstruct.errors import ConfigError
from tests.algos.test_captured_runs import fast_config
from tests.algos.test_same_run import without_wall_clock
from tests.fakes import ConstantAgent, CountingEnv
from tests.fakes_accel import RecordingAccelerator
from tests.helpers import wall_limit

pytestmark = [pytest.mark.timeout(300)]

AUTORESET = {"n_envs": 2, "autoreset": True, "episode_lengths": (5,)}
COMMON = ["--env", "CartPole-v1", "--seed", "5", "--no-progress", "--no-tensorboard", "--preset", "none",
          "--n-envs", "4", "--n-evaluation-envs", "2", "--evaluation-max-steps", "40", "--deterministic"]
RUNS = {
    "a2c": ["--n-steps", "8", "--max-env-steps", "256", "--eval-every", "2"],
    "ppo": ["--n-steps", "16", "--n-minibatches", "2", "--n-epochs", "2", "--max-env-steps", "256", "--eval-every",
            "2"],
    "dqn": ["--max-env-steps", "320", "--learning-starts", "96", "--gradient-steps", "2", "--batch-size", "32",
            "--epsilon-decay-steps", "200", "--eval-every", "10"],
}


def _run(logdir: Path, algo: str) -> tuple[list[list[str]], dict[str, torch.Tensor]]:
    assert cli.main(["train", algo, *COMMON, *RUNS[algo], "--logdir", str(logdir)]) == 0
    checkpoint = torch.load(logdir / "checkpoint.pt", map_location="cpu", weights_only=False)
    return without_wall_clock(logdir / "progress.csv"), checkpoint["model"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(RUNS))
def test_two_deterministic_runs_of_one_seed_give_the_same_rows_and_weights(tmp_path, monkeypatch, algo):
    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV, raising=False)
    rows, weights = _run(tmp_path / "first", algo)
    again, weights_again = _run(tmp_path / "second", algo)
    assert len(rows) > 3 and any(row[rows[0].index("eval/return")] for row in rows[1:])
    assert again == rows
    assert weights.keys() == weights_again.keys()
    for name, value in weights.items():  # bit for bit, NaNs and signed zeros included
        assert torch.equal(value.view(torch.uint8), weights_again[name].view(torch.uint8)), name
    assert json.loads((tmp_path / "first" / "config.json").read_text())["deterministic"] is True
    # The run's settings are its own (the command line's cuBLAS setting, made for the process's CUDA context, stays).
    assert not torch.are_deterministic_algorithms_enabled() and DETERMINISTIC_ENV not in os.environ


def test_a_run_is_deterministic_while_it_trains_and_restores_the_settings_after(tmp_path, monkeypatch):
    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV, raising=False)
    seen = []
    config = A2CConfig(env="CartPole-v1", n_envs=4, n_steps=4, max_env_steps=64, eval_every=2, n_evaluation_envs=2,
                       evaluation_max_steps=10, progress=False, tensorboard=False, preset="none", deterministic=True,
                       logdir=str(tmp_path / "run"))
    setup = entry.validate(config)
    setup = dataclasses.replace(setup, on_evaluation=(lambda row: seen.append((
        torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark, os.environ.get(CUBLAS_WORKSPACE_ENV), os.environ.get(DETERMINISTIC_ENV))),))
    loops.run(setup)
    assert seen and set(seen) == {(True, True, False, ":4096:8", "1")}
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
    assert CUBLAS_WORKSPACE_ENV not in os.environ


@pytest.mark.slow
def test_a_worker_process_of_a_deterministic_run_is_deterministic_with_the_cublas_setting(monkeypatch):
    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV, raising=False)
    with deterministic_mode():
        with RL_Batcher(3, ConstantAgent, {}, CountingEnv, AUTORESET, 1, [0]) as batcher:
            report, = batcher.worker_reports()
    assert report["deterministic"] is True and report["environ"][CUBLAS_WORKSPACE_ENV] == ":4096:8"
    with RL_Batcher(3, ConstantAgent, {}, CountingEnv, AUTORESET, 1, [0]) as batcher:
        report, = batcher.worker_reports()
    assert report["deterministic"] is False and report["environ"][CUBLAS_WORKSPACE_ENV] is None


def test_the_command_line_sets_the_cublas_workspace_before_anything_else(monkeypatch, capsys):
    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV, raising=False)
    # A flag refused after the parse: the environment was set first, before any check could make a CUDA context.
    assert train_command.main("a2c", ["--deterministic", "--n-envs", "0", "--no-progress"]) == 2
    assert os.environ[CUBLAS_WORKSPACE_ENV] == ":4096:8"
    assert "n_envs must be >= 1" in capsys.readouterr().err


def test_a_cublas_setting_that_is_not_deterministic_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(CUBLAS_WORKSPACE_ENV, ":0:0")
    config = A2CConfig(deterministic=True, logdir=str(tmp_path / "run"), progress=False, tensorboard=False)
    with pytest.raises(ConfigError, match=r"A2C: deterministic=True needs CUBLAS_WORKSPACE_CONFIG to be one of "
                                          r"\[':4096:8', ':16:8'\].*got ':0:0'; unset it or export"):
        entry.validate(config)
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv(CUBLAS_WORKSPACE_ENV, ":16:8")
    entry.validate(config).lock.release()


def test_a_cuda_context_made_before_the_cublas_setting_is_refused(monkeypatch):
    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"PPO: deterministic=True needs CUBLAS_WORKSPACE_CONFIG=:4096:8 in the "
                                          r"environment before the process's first CUDA call .* got a CUDA context "
                                          r"made without it; export"):
        check_cublas_workspace("PPO", cuda_initialized=lambda: True)
    check_cublas_workspace("PPO", cuda_initialized=lambda: False)
    monkeypatch.setenv(CUBLAS_WORKSPACE_ENV, ":4096:8")
    check_cublas_workspace("PPO", cuda_initialized=lambda: True)


def test_deterministic_mode_turns_an_operation_without_a_deterministic_kernel_into_an_error(monkeypatch):
    """``warn_only=False``: an operation torch cannot run deterministically raises instead of warning. On the CPU
    one is ``put_`` without ``accumulate`` (its duplicate indices race); on CUDA the library's own step paths have
    none (``index_add_`` and ``scatter_add_`` take their sorted kernels)."""
    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV, raising=False)
    x = torch.zeros(3)
    with deterministic_mode(), pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
        x.put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))
    x.put_(torch.tensor([0, 0]), torch.tensor([1.0, 2.0]))


_WITHOUT_INDUCTOR = """
import sys
import torch
from rlstruct._determinism import deterministic_mode
with deterministic_mode():
    assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    assert "torch._inductor" not in sys.modules, "deterministic mode imported inductor"
    import torch._inductor.config as inductor_config
    assert inductor_config.deterministic, "inductor imported in deterministic mode is not deterministic"
assert not torch.are_deterministic_algorithms_enabled() and not inductor_config.deterministic
"""


@pytest.mark.slow  # a fresh interpreter importing torch: 2-3 CPU s
@pytest.mark.timeout(120)
def test_deterministic_mode_leaves_inductor_unloaded_and_inductor_loaded_in_it_deterministic(monkeypatch):
    """torch's own switch imports inductor to set its flag (about 2 CPU s, at each deterministic worker's start);
    the mode sets torch's flag alone and inductor's where it is loaded, or where it will be (its environment)."""
    monkeypatch.delenv("TORCHINDUCTOR_DETERMINISTIC", raising=False)
    done = subprocess.run([sys.executable, "-c", _WITHOUT_INDUCTOR], capture_output=True, text=True,
                          timeout=wall_limit(100))
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_worker_turns_deterministic_mode_on_from_its_environment(monkeypatch):
    monkeypatch.setenv(DETERMINISTIC_ENV, "0")
    assert not _determinism.apply_from_environment()
    monkeypatch.setenv(DETERMINISTIC_ENV, "1")
    monkeypatch.setenv("TORCHINDUCTOR_DETERMINISTIC", "0")
    try:
        assert _determinism.apply_from_environment() and torch.are_deterministic_algorithms_enabled()
        assert os.environ["TORCHINDUCTOR_DETERMINISTIC"] == "1"
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["a2c", "ppo"])
def test_two_deterministic_runs_on_the_fast_path_give_the_same_bits(tmp_path, monkeypatch, algo):
    """Captured acquisition and evaluation, the compiled update in graph mode and overlap, through the seam's
    recording fake: nothing on those paths is refused by deterministic mode, and two runs agree bit for bit. The same
    two runs in one process are A2C's and PPO's case of ``test_captured_runs.py`` (every graph replayed more than
    once, each replay finding the tensors it touches alive, each graph's workspace its own and released): checked
    here, on these runs, rather than on two more."""
    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV, raising=False)
    module, cls = {"a2c": (a2c, a2c.A2CConfig), "ppo": (ppo, ppo.PPOConfig)}[algo]
    fake = RecordingAccelerator()
    runs = []
    with _accel.installed("cpu", fake):
        for name in ("first", "second"):
            module.train(fast_config(cls, tmp_path, name, deterministic=True))
            checkpoint = torch.load(tmp_path / name / "checkpoint.pt", map_location="cpu", weights_only=False)
            runs.append((without_wall_clock(tmp_path / name / "progress.csv"), checkpoint["model"]))
    (rows, weights), (again, weights_again) = runs
    assert len(rows) > 3 and again == rows
    assert all(torch.equal(v.view(torch.uint8), weights_again[k].view(torch.uint8)) for k, v in weights.items())
    assert len(fake.graphs) == 4 and fake.compiles == [("reduce-overhead", "inductor")] * 2
    assert all(g.replays > 2 for g in fake.graphs), [g.replays for g in fake.graphs]
    assert all(g.released and g.workspaces and all(ws.owner is g for ws in g.workspaces) for g in fake.graphs)
    assert fake.step_marks > 0


def test_a_deterministic_run_starts_its_ray_actors_with_the_deterministic_environment(tmp_path, monkeypatch):
    """A Ray actor's process is not this one's child: the run hands it the mode's variables in its runtime_env
    (the actor turning the mode on from them is ``test_ray_batcher``'s)."""
    import rlstruct.batchers

    monkeypatch.delenv(CUBLAS_WORKSPACE_ENV, raising=False)
    given = []

    class Started(Exception):
        pass

    def ray_batcher(*args, **kwargs):
        given.append(kwargs["runtime_env"])
        raise Started

    monkeypatch.setattr(rlstruct.batchers, "RayBatcher", ray_batcher)
    monkeypatch.setattr(session, "ray_session", lambda address: contextlib.nullcontext())
    config = dict(env="CartPole-v1", n_envs=4, n_steps=4, max_env_steps=64, progress=False, tensorboard=False,
                  preset="none", ray_actors=1)
    for deterministic in (True, False):
        with pytest.raises(Started):
            entry.train(A2CConfig(**config, deterministic=deterministic, logdir=str(tmp_path / f"{deterministic}")))
    assert given == [{"env_vars": {CUBLAS_WORKSPACE_ENV: ":4096:8", DETERMINISTIC_ENV: "1",
                                   "TORCHINDUCTOR_DETERMINISTIC": "1"}}, None]
