import dataclasses
import json

import pytest

optuna = pytest.importorskip("optuna", reason="rlstruct sweep needs Optuna: pip install 'rlstruct[sweep]'")

from rlstruct.algos import cli  # noqa: E402
from rlstruct.algos._train.registry import ALGORITHMS, algorithm  # noqa: E402
from rlstruct.algos._train.search_space import check_space, covering, load_space  # noqa: E402
from rlstruct.algos._train.sweep import run_sweep  # noqa: E402
from rlstruct.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.timeout(300)

#: a few hundred env steps a trial, an evaluation (two short episodes) after every iteration
TINY = ["--max-env-steps", "256", "--n-envs", "4", "--n-steps", "8", "--eval-every", "1", "--n-evaluation-envs", "2",
        "--evaluation-max-steps", "20", "--no-progress", "--no-tensorboard", "--time-limit", "120"]
LR_ONLY = {"lr": {"low": 1e-4, "high": 1e-2, "log": True}}


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_every_algorithm_has_a_space_that_holds_its_defaults(algo):
    config_cls = algorithm(algo).config_cls
    space = check_space(algorithm(algo).search_space, config_cls)
    assert covering(space, dataclasses.asdict(config_cls())) == space


def test_the_preset_is_trial_0_and_a_second_call_adds_trials(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path}/db/sweeps.db"
    kwargs = {"storage": storage, "study_name": "s", "logdir": str(tmp_path / "trials"), "flags": TINY,
              "space": {**LR_ONLY, "gae_lambda": {"low": 0.8, "high": 1.0}}, "pruner": "none"}
    study = run_sweep("a2c", "CartPole-v1", trials=2, **kwargs)
    first = study.trials[0]
    # a2c-cartpole's settings; A2C's defaults where the preset says nothing
    assert first.params == {"lr": 5e-3, "gae_lambda": 0.95} and first.user_attrs["preset"] == "a2c-cartpole"
    assert first.user_attrs["settings"]["entropy_coef"] == 0.01 and first.user_attrs["settings"]["n_envs"] == 4
    assert study.trials[1].params != first.params
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    for t in study.trials:
        summary = json.loads((tmp_path / "trials" / f"trial-{t.number}" / "summary.json").read_text())
        assert summary["eval_return"] == t.value and summary["env_steps"] >= 256
    assert run_sweep("a2c", "CartPole-v1", trials=1, **kwargs).trials[2].state.name == "COMPLETE"
    assert len(optuna.load_study(study_name="s", storage=storage).trials) == 3
    assert "trial 2: complete" in capsys.readouterr().out


def test_trials_are_pruned_on_their_evaluations(tmp_path):
    # a threshold no return reaches: the first evaluation of trained weights prunes each trial
    study = run_sweep("ppo", "CartPole-v1", trials=2, storage=f"sqlite:///{tmp_path}/s.db", space=LR_ONLY,
                      flags=[*TINY, "--max-env-steps", "2048"], logdir=str(tmp_path / "trials"),
                      pruner=optuna.pruners.ThresholdPruner(lower=1e9))
    assert [t.state.name for t in study.trials] == ["PRUNED", "PRUNED"]
    for t in study.trials:
        assert list(t.intermediate_values) == [0]  # reported at the first tenth of the budget, then stopped
        folder = tmp_path / "trials" / f"trial-{t.number}"
        assert (folder / "progress.csv").is_file() and not (folder / "summary.json").exists()


def test_the_command_runs_parallel_trials_and_prints_a_preset_to_paste(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text("lr:\n  low: 0.0001\n  high: 0.01\n  log: true\n")
    assert cli.main(["sweep", "ppo", "--env", "CartPole-v1", "--trials", "2", "--n-jobs", "2", "--space",
                     "space.yaml", "--", *TINY]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    out = json.loads(lines[-1])
    assert out["study"] == "ppo-CartPole-v1" and out["storage"] == "sqlite:///runs/sweeps.db"
    assert out["trials"] == out["complete"] == 2 and (tmp_path / "runs" / "sweeps.db").is_file()
    assert set(out["best_params"]) == {"lr"} and out["best_settings"]["lr"] == out["best_params"]["lr"]
    assert any(line.startswith("rlstruct train ppo --env CartPole-v1 ") for line in lines)
    assert any(line.strip().startswith('Preset("ppo-cartpole-v1-sweep", "ppo"') for line in lines)
    assert (tmp_path / "runs" / "sweeps" / "ppo-CartPole-v1" / f"trial-{out['best_trial']}" / "summary.json").is_file()


def test_bad_sweeps_fail_with_one_line_before_any_trial(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.json").write_text(json.dumps({"learning_rate": {"low": 0.1, "high": 1.0}}))
    assert cli.main(["sweep", "ppo", "--env", "CartPole-v1", "--space", "space.json"]) == 2
    assert "names 'learning_rate', which PPOConfig does not have" in capsys.readouterr().err
    assert cli.main(["sweep", "ppo", "--env", "NoSuchEnv-v0", "--", *TINY]) == 2
    assert "NoSuchEnv-v0" in capsys.readouterr().err
    assert cli.main(["sweep", "ppo", "--env", "CartPole-v1", "--trials", "0"]) == 2
    assert "trials and n_jobs must be >= 1, got 0 and 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="must be a JSON or YAML mapping"):
        (tmp_path / "bad.json").write_text("{")
        load_space(tmp_path / "bad.json", algorithm("ppo").config_cls)
    assert not (tmp_path / "runs").exists()


def test_run_sweep_refuses_what_no_trial_could_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path}/s.db"
    with pytest.raises(ValueError, match="ALGO must be one of"):
        run_sweep("ppo2", "CartPole-v1", trials=1, storage=storage)
    with pytest.raises(ConfigError, match="reports evaluations at tenths of the step budget, got max_env_steps=None"):
        run_sweep("ppo", "CartPole-v1", trials=1, storage=storage, flags=["--max-env-steps", "none", "--no-anneal-lr"])
    with pytest.raises(ConfigError, match=r"the flags given fix every field of the search space \(\['lr'\]\)"):
        run_sweep("ppo", "CartPole-v1", trials=1, storage=storage, space=LR_ONLY, flags=["--lr", "1e-3"])
    with pytest.raises(ValueError, match="pruner must be one of"):
        run_sweep("ppo", "CartPole-v1", trials=1, storage=storage, pruner="hyperband")
    assert not (tmp_path / "s.db").exists()  # refused before the study was created
