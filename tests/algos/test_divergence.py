"""The non-finite guard: NaN or infinite settings are refused at setup; a run whose loss, gradient norm or weights turn
non-finite stops as diverged (both loops, every algorithm), keeps the checkpoint written before and reports no result;
checkpoints holding NaN are refused wherever they are read; ``Policy.predict`` refuses NaN observations.

The faults are injected: NaN written into the learner's policy weights at the end of a chosen iteration (a wrapper of
the loops' ``record_iteration``), NaN written into a saved checkpoint, NaN given to ``predict``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import typing

import numpy as np
import pytest
import torch

from rlstruct.algos import a2c, describe_env, dqn, load, ppo, pqn, reinforce, sac, td3
from rlstruct.algos._train import cli, loops
from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME, content_digest
from rlstruct.algos._train.config import RunConfig
from rlstruct.algos._train.finite import DivergenceGuard, non_finite
from rlstruct.algos._train.log import Run
from rlstruct.algos._train.registry import ALGORITHMS, algorithm
from rlstruct.algos._train.run_folder import CONFIG_NAME, SUMMARY_NAME
from rlstruct.algos._train.session import validate
from rlstruct.errors import CheckpointError, SpaceError

pytestmark = pytest.mark.timeout(120)

SMALL = {"hidden_sizes": (8,), "progress": False, "tensorboard": False, "n_evaluation_envs": 2, "eval_every": 4,
         "max_episode_steps": 50, "stop_at_reward_threshold": False, "time_limit": 100.0, "preset": "none",
         "checkpoint_every": 2, "log_every": 3}

#: (module, config, env steps of an iteration or None for whole episodes); twelve iterations at most
CASES = {
    "reinforce": (reinforce, reinforce.ReinforceConfig(n_envs=4, max_env_steps=12 * 200, **SMALL)),
    "a2c": (a2c, a2c.A2CConfig(n_envs=4, n_steps=8, max_env_steps=12 * 32, **SMALL)),
    "ppo": (ppo, ppo.PPOConfig(n_envs=4, n_steps=8, n_epochs=2, n_minibatches=2, max_env_steps=12 * 32, **SMALL)),
    "pqn": (pqn, pqn.PQNConfig(n_envs=4, n_steps=8, n_epochs=1, n_minibatches=2, max_env_steps=12 * 32, **SMALL)),
    "dqn": (dqn, dqn.DQNConfig(n_envs=4, rollout_steps=4, learning_starts=32, gradient_steps=2, batch_size=16,
                               buffer_size=1000, target_update_interval=4, max_env_steps=12 * 16, **SMALL)),
    "sac": (sac, sac.SACConfig(n_envs=2, rollout_steps=4, learning_starts=16, gradient_steps_per_env_step=0.25,
                               batch_size=16, buffer_size=1000, max_env_steps=12 * 8, **SMALL)),
    "td3": (td3, td3.TD3Config(n_envs=2, rollout_steps=4, learning_starts=16, gradient_steps_per_env_step=0.25,
                               batch_size=16, buffer_size=1000, max_env_steps=12 * 8, **SMALL)),
}
#: the iteration at whose end the weights turn NaN
FAULT = 5


@pytest.fixture
def nan_weights(monkeypatch):
    """Writes ``value`` into every weight of the learner's policy at the end of ``iteration`` (``record_iteration``,
    which both loops call once an iteration with their policy); returns the list of the iterations it did."""

    def inject(iteration: int, value: float = math.nan) -> list[int]:
        done: list[int] = []
        real = loops.record_iteration

        def record(run, evaluator, n_steps, stats, *, model, **kwargs):
            real(run, evaluator, n_steps, stats, model=model, **kwargs)
            if run.iteration == iteration:
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(value)
                done.append(iteration)

        monkeypatch.setattr(loops, "record_iteration", record)
        return done

    return inject


def _float_fields(config_cls: type) -> list[str]:
    hints = typing.get_type_hints(config_cls)
    return [f.name for f in dataclasses.fields(config_cls) if hints[f.name] in (float, float | None)]


# --------------------------------------------------------------------------- settings
FLOAT_FIELDS = [(name, field) for name in ALGORITHMS for field in _float_fields(algorithm(name).config_cls)]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("name, field", FLOAT_FIELDS, ids=[f"{n}-{f}" for n, f in FLOAT_FIELDS])
def test_a_non_finite_setting_is_refused_at_setup(name, field, value, tmp_path):
    description = algorithm(name)
    config = dataclasses.replace(description.config_cls(), **{field: value}, logdir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match=rf"^{field} must be a finite number, got {value!r}; pass a finite "
                                         rf"--{field.replace('_', '-')} \(its default: "):
        validate(description, config)
    assert not (tmp_path / "run").exists()


def test_every_family_has_float_settings_checked():
    # What the parametrization covers: the shared, the families' and the algorithms' own float settings.
    checked = {field for _, field in FLOAT_FIELDS}
    assert {"lr", "time_limit", "target_return", "gamma", "priority_alpha", "clip_coef", "tau", "critic_lr",
            "q_lambda", "gae_lambda", "entropy_coef", "max_grad_norm"} <= checked


def test_lr_inf_on_the_command_line_is_one_line_and_status_2(tmp_path, capsys):
    logdir = tmp_path / "run"
    code = cli.main(["train", "a2c", "--lr", "inf", "--logdir", str(logdir), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0] == ("rlstruct train a2c: error: lr must be a finite number, got inf; pass a finite --lr (its "
                      "default: 0.005)")
    assert not logdir.exists()


def test_a_time_limit_suggests_a_large_finite_number():
    with pytest.raises(ValueError, match=r"time_limit must be a finite number, got inf; .* or a large one, e\.g\. "
                                         r"1e9, for no practical limit"):
        validate(a2c.ALGORITHM, a2c.A2CConfig(time_limit=math.inf))


# --------------------------------------------------------------------------- a run that diverges
def _assert_diverged(result, logdir, *, first_possible: int) -> None:
    assert result.stop_reason == "diverged", result.summary()
    assert math.isnan(result.eval_return) and not result.reached_target
    found = result.diverged
    assert found["quantity"].startswith(("loss", "grad_norm", "weights/")), found
    # Found at the check that follows the fault: at most log_every iterations later (or at the flush of an error).
    assert first_possible <= found["iteration"] <= result.iterations <= FAULT + 1 + SMALL["log_every"], found
    summary = json.loads((logdir / SUMMARY_NAME).read_text())
    assert summary["stop_reason"] == "diverged" and math.isnan(summary["eval_return"])
    assert summary["diverged"]["quantity"] == found["quantity"] and summary["reached_target"] is False
    # No evaluation row after the last training row: no final evaluation was run.
    assert "eval/return" not in result.history[-1] or result.history[-1]["iteration"] < result.iterations
    # The checkpoint kept is the periodic one written before the fault, finite, and it loads.
    assert result.checkpoint == str(logdir / CHECKPOINT_NAME)
    kept = torch.load(logdir / CHECKPOINT_NAME, weights_only=True)
    assert kept["iteration"] == FAULT - 1 and non_finite(kept["model"]) is None
    load(logdir)


@pytest.mark.parametrize("algo", list(CASES))
def test_nan_weights_stop_the_run_as_diverged_and_keep_the_earlier_checkpoint(algo, tmp_path, nan_weights):
    module, config = CASES[algo]
    done = nan_weights(FAULT)
    logdir = tmp_path / "run"
    result = module.train(dataclasses.replace(config, logdir=str(logdir)))
    assert done == [FAULT]
    _assert_diverged(result, logdir, first_possible=FAULT)


def test_the_command_line_says_so_and_exits_1(tmp_path, nan_weights, capsys, caplog):
    done = nan_weights(FAULT)
    logdir = tmp_path / "run"
    argv = ["train", "a2c", "--logdir", str(logdir), "--no-progress", "--no-tensorboard", "--preset", "none",
            "--n-envs", "4", "--n-steps", "8", "--max-env-steps", str(12 * 32), "--hidden-sizes", "8",
            "--n-evaluation-envs", "2", "--max-episode-steps", "50", "--no-stop-at-reward-threshold",
            "--checkpoint-every", "2", "--log-every", "3", "--eval-every", "4"]
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert done == [FAULT] and code == 1, err
    stop = [line for line in out.splitlines() if line.startswith("stopped:")]
    assert len(stop) == 1 and "stopped: the run diverged, loss/" in stop[0] and "no evaluation of it counts" in stop[0]
    assert "final evaluation return" not in out
    assert json.loads(out.strip().splitlines()[-1])["stop_reason"] == "diverged"
    warning = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]  # stderr's one line
    assert len(warning) == 1 and f"kept: {logdir / CHECKPOINT_NAME}" in warning[0], warning
    assert torch.load(logdir / CHECKPOINT_NAME, weights_only=True)["iteration"] == FAULT - 1


@pytest.mark.slow
def test_a_huge_finite_learning_rate_diverges_in_its_own_process(tmp_path):
    # No injection: --lr 1e30 is finite, so it is accepted, and its first update blows the value loss up.
    logdir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "rlstruct.algos", "train", "a2c", "--lr", "1e30", "--logdir",
                          str(logdir), "--no-progress", "--no-tensorboard", "--preset", "none", "--n-envs", "4",
                          "--max-env-steps", "2000", "--hidden-sizes", "8", "--n-evaluation-envs", "2",
                          "--max-episode-steps", "50"], capture_output=True, text=True, timeout=150)
    assert out.returncode == 1, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["stop_reason"] == "diverged" and math.isnan(summary["eval_return"])
    assert summary["diverged"]["quantity"].startswith("loss/") and summary["checkpoint"] is None
    assert summary["iterations"] <= summary["diverged"]["iteration"] + 10  # found within --log-every iterations
    assert [line for line in out.stdout.splitlines() if "diverged" in line][0].startswith("stopped: the run diverged")
    assert len([line for line in out.stderr.splitlines() if "diverged" in line]) == 1, out.stderr
    assert not (logdir / CHECKPOINT_NAME).exists()


def test_weights_that_turn_nan_in_the_last_iteration_are_not_checkpointed(tmp_path, nan_weights):
    # No loss sees them: the weights' own check, before the final evaluation and checkpoint, finds them.
    module, config = CASES["a2c"]
    last = config.max_env_steps // 32
    nan_weights(last, math.inf)
    logdir = tmp_path / "run"
    result = module.train(dataclasses.replace(config, logdir=str(logdir), checkpoint_every=last - 1, log_every=100))
    assert result.stop_reason == "diverged" and result.diverged["quantity"].startswith("weights/")
    assert result.diverged["iteration"] == last and math.isnan(result.eval_return)
    assert torch.load(logdir / CHECKPOINT_NAME, weights_only=True)["iteration"] == last - 1


def test_a_diverged_runs_summary_and_config_are_written_whole(tmp_path, nan_weights, monkeypatch):
    """Through a file renamed onto each (a kill while writing leaves the previous file, never an empty one)."""
    swapped = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (swapped.append(os.path.basename(dst)),
                                                         real_replace(src, dst))[1])
    module, config = CASES["a2c"]
    nan_weights(FAULT)
    result = module.train(dataclasses.replace(config, logdir=str(tmp_path / "run")))
    assert result.stop_reason == "diverged"
    assert CONFIG_NAME in swapped and swapped[-1] == SUMMARY_NAME, swapped


def test_an_error_the_divergence_explains_ends_the_run_as_diverged(tmp_path, nan_weights):
    # SAC's NaN actions are refused by the env (ActionRangeError) before the statistics' next check.
    module, config = CASES["sac"]
    nan_weights(FAULT)
    logdir = tmp_path / "run"
    result = module.train(dataclasses.replace(config, logdir=str(logdir), log_every=100, eval_every=100,
                                              checkpoint_every=FAULT - 1))
    assert result.stop_reason == "diverged" and math.isnan(result.eval_return)
    assert result.diverged["error"].startswith("ActionRangeError: action['action'] must be in"), result.diverged
    assert torch.load(logdir / CHECKPOINT_NAME, weights_only=True)["iteration"] == FAULT - 1


def test_an_error_of_a_run_that_did_not_diverge_is_raised(tmp_path, monkeypatch):
    module, config = CASES["a2c"]

    def broken(*args, **kwargs):
        raise RuntimeError("an env failed")

    monkeypatch.setattr(loops, "record_iteration", broken)
    with pytest.raises(RuntimeError, match="an env failed"):
        module.train(dataclasses.replace(config, logdir=str(tmp_path / "run")))


def test_the_guard_reports_the_first_non_finite_statistic():
    guard = DivergenceGuard()
    rows = [{"iteration": 7, "loss/policy": 0.5, "train/episode_return": math.nan},
            {"iteration": 8, "q_mean": math.inf, "loss/value": math.inf, "grad_norm": math.nan}]
    guard.scan(rows, {"weights/pi.weight": 0.0}, 8)
    assert guard.found == {"quantity": "loss/value", "iteration": 8, "value": "inf"}
    guard.scan([{"iteration": 9, "loss/policy": math.nan}], {}, 9)
    assert guard.found["iteration"] == 8, "the first one found stays"
    weights = DivergenceGuard()
    model = torch.nn.Linear(2, 1)
    weights.watch(model.state_dict)
    assert set(weights.weight_flags()) == {"weights/weight", "weights/bias"}
    with torch.no_grad():
        model.bias.fill_(math.nan)
    flags = {k: float(v) for k, v in weights.weight_flags().items()}
    weights.scan([{"iteration": 3, "loss/q": 1.0}], flags, 3)
    assert weights.found == {"quantity": "weights/bias", "iteration": 3, "value": "nan or inf"}


def test_the_guard_adds_no_host_sync_between_the_runs_conversions(tmp_path, monkeypatch):
    # The statistics and the weights' finiteness are converted together, once every log_every iterations.
    config = RunConfig(logdir=str(tmp_path), progress=False, tensorboard=False, log_every=5)
    run = Run("a2c", config, describe_env(config.env, config.backend, None, None))
    model = torch.nn.Linear(4, 2)
    run.stop_rule.guard.watch(model.state_dict)
    syncs: list[str] = []
    for name in ("tolist", "item", "__bool__", "__float__"):
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name):
            syncs.append(_name)
            return _real(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    for i in range(10):
        run.record(8, {"loss/policy": torch.tensor(float(i)), "grad_norm": torch.tensor(1.0)})
    monkeypatch.undo()
    assert syncs == ["tolist", "tolist"]
    assert run.stop_rule.diverged is None and len(run.history) == 10
    with torch.no_grad():
        model.weight[0, 0] = math.nan
    run.record(8, {"loss/policy": torch.tensor(0.0)})
    assert run.stop_rule.diverged is None, "found at the next conversion, not before"
    run.flush()
    assert run.stop_rule.diverged == {"quantity": "weights/weight", "iteration": 11, "value": "nan or inf"}
    assert run.should_stop() and run.stop_rule.reason == "diverged"
    run.close()


# --------------------------------------------------------------------------- checkpoints holding NaN
@pytest.fixture(scope="module")
def finite_run(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("finite")
    module, config = CASES["a2c"]
    module.train(dataclasses.replace(config, logdir=str(logdir), max_env_steps=4 * 32))
    return logdir


@pytest.fixture
def nan_checkpoint(finite_run, tmp_path):
    """A copy of the run's checkpoint with one NaN in its policy's first tensor (named in the return)."""
    data = torch.load(finite_run / CHECKPOINT_NAME, weights_only=True)
    name = next(iter(data["model"]))
    data["model"][name].view(-1)[0] = math.nan
    data["digest"] = content_digest(data)  # written whole, by a run whose weights had turned NaN
    path = tmp_path / "nan.pt"
    torch.save(data, path)
    return path, name


def test_load_refuses_nan_weights(nan_checkpoint):
    path, name = nan_checkpoint
    with pytest.raises(CheckpointError, match=rf"run_or_checkpoint='{path}' holds non-finite weights: model\.{name} "
                                              r"has 1 NaN or infinite value\(s\) of \d+ \(the run that wrote it "
                                              r"diverged\); pass a checkpoint written before the divergence"):
        load(path)


@pytest.mark.parametrize("command", ["eval", "export"])
def test_eval_and_export_refuse_nan_weights_in_one_line(nan_checkpoint, command, tmp_path, capsys):
    path, name = nan_checkpoint
    argv = [command, str(path)] + (["--output", str(tmp_path / "policy.pt")] if command == "export" else [])
    code = cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"rlstruct {command}: error: ") and f"holds non-finite weights: model.{name}" in err[0]
    assert not (tmp_path / "policy.pt").exists()


def test_resume_refuses_nan_weights(nan_checkpoint, capsys):
    path, name = nan_checkpoint
    with pytest.raises(CheckpointError, match=rf"resume='{path}' holds non-finite weights: model\.{name}"):
        a2c.train(dataclasses.replace(CASES["a2c"][1], resume=str(path)))
    assert cli.main(["train", "a2c", "--resume", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds non-finite weights" in err[0], err


def test_resume_refuses_a_nan_learner_state(finite_run, tmp_path):
    data = torch.load(finite_run / CHECKPOINT_NAME, weights_only=True)
    moments = next(iter(data["learner"]["optimizer"]["state"].values()))["exp_avg"]
    moments.view(-1)[0] = math.inf
    data["digest"] = content_digest(data)
    path = tmp_path / "inf.pt"
    torch.save(data, path)
    load(path)  # the policy is finite: it evaluates
    with pytest.raises(CheckpointError, match=r"holds non-finite weights: learner\.optimizer\.state\.0\.exp_avg has "
                                              r"1 NaN or infinite"):
        a2c.train(dataclasses.replace(CASES["a2c"][1], resume=str(path)))


# --------------------------------------------------------------------------- predict
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_predict_refuses_non_finite_observations(finite_run, bad):
    policy = load(finite_run)
    observation = np.zeros(4, np.float32)
    assert policy.predict(observation) in (0, 1)
    observation[2] = bad
    with pytest.raises(SpaceError, match=r"^observation must hold finite values, got 1 NaN or infinite value\(s\) of "
                                         r"4; pass the env's observation"):
        policy.predict(observation)
    batch = torch.zeros(3, 4)
    batch[1:, 0] = bad
    with pytest.raises(SpaceError, match=r"got 2 NaN or infinite value\(s\) of 12"):
        policy.predict(batch)
