"""Presets: tuned settings applied to the fields a run does not give, from Python and from the command line; what
wins, what is recorded, what a resumed run keeps, and that every entry of the table fits its algorithm's config."""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
import types
import typing

import pytest

from rlstruct.algos import EnvSpec, a2c, dqn, impala, ppo, pqn, reinforce, sac, td3
from rlstruct.algos._train.presets import (
    PRESETS,
    apply_preset,
    describe_preset,
    find_preset,
    given_fields,
    list_presets,
    preset_named,
    preset_stop_target,
    preset_target,
)
from rlstruct.algos._train.session import validate
from rlstruct.algos._train.stop_rule import run_target
from rlstruct.errors import ConfigError
from tests.algos.test_cli import last_json
from tests.helpers import rlstruct_in_process

CONFIGS = {"a2c": a2c.A2CConfig, "dqn": dqn.DQNConfig, "ppo": ppo.PPOConfig, "reinforce": reinforce.ReinforceConfig,
           "sac": sac.SACConfig, "pqn": pqn.PQNConfig, "td3": td3.TD3Config, "impala": impala.IMPALAConfig}
PENDULUM = find_preset("ppo", "Pendulum-v1")


# --------------------------------------------------------------------------- the table
@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_preset_sets_fields_of_its_algorithm_in_their_types(preset):
    cls = CONFIGS[preset.algo]
    hints = typing.get_type_hints(cls)
    for name, value in preset.settings.items():
        assert name in hints, f"{preset.name} sets {name!r}, which {cls.__name__} does not have"
        union = typing.get_origin(hints[name]) in (typing.Union, types.UnionType)
        kinds = tuple(a for a in typing.get_args(hints[name]) if a is not type(None)) if union else (hints[name],)
        kinds = tuple(typing.get_origin(k) or k for k in kinds)
        assert isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds), (preset.name, name)
    assert preset.unsupported or preset.settings.get("max_env_steps"), f"{preset.name} gives no step budget"
    if preset.auto:
        assert find_preset(preset.algo, preset.envs[0]) is preset, "an earlier entry hides this one"
    else:
        assert find_preset(preset.algo, preset.envs[0]) is not preset, "a published-budget preset runs only by name"
        assert preset_named(preset.name, preset.algo, preset.envs[0]) is preset


def test_the_names_are_unique_and_the_listing_names_every_preset():
    names = [p.name for p in PRESETS]
    assert len(set(names)) == len(names)
    listing = list_presets()
    assert all(name in listing for name in names) and "not learned" in listing


@pytest.mark.parametrize(("name", "env", "budget"), [
    ("ppo-minatar-5m", "MinAtar/Breakout-v1", 5_000_000), ("pqn-minatar-5m", "MinAtar/SpaceInvaders-v1", 5_000_000),
    ("dqn-minatar-5m", "MinAtar/Asterix-v1", 5_000_000), ("impala-minatar-5m", "MinAtar/Freeway-v1", 5_000_000),
    ("ppo-mujoco-1m", "Hopper-v4", 1_000_000)])
def test_the_published_budget_presets_train_for_the_whole_budget_only_when_named(name, env, budget):
    """One command runs a published budget (``--preset NAME``): no target stops it (the published figures are returns
    at the budget) and MinAtar plays with the paper's sticky actions; naming the env alone keeps the tuned preset."""
    algo = name.split("-")[0]
    config, preset = apply_preset(algo, CONFIGS[algo](env=env, preset=name))
    assert preset.name == name and config.max_env_steps == budget and not config.stop_at_reward_threshold
    assert run_target(config, EnvSpec((4,), "float32", 2, 500, reward_threshold=3800.0)) is None
    assert preset_stop_target(name, env) is None and preset_target(name) is None
    if env.startswith("MinAtar/"):
        # PQN's envs start out of step (random starts of up to one Freeway game), in training only.
        starts = {"random_start_steps": 2_500} if algo == "pqn" else {}
        assert config.env_kwargs == {"sticky_action_prob": 0.1, **starts} and config.max_episode_steps == 10_000
    # IMPALA has no MinAtar preset at a smaller budget: naming the env alone gives its defaults.
    tuned = {"ppo-mujoco-1m": "ppo-mujoco", "impala-minatar-5m": None}.get(name, name.removesuffix("-5m"))
    assert getattr(find_preset(algo, env), "name", None) == tuned
    with pytest.raises(ConfigError, match="preset 'ppo-mujoco-1m' is for ppo on"):
        apply_preset("ppo", ppo.PPOConfig(env="Hopper-v5", preset="ppo-mujoco-1m"))


def test_td3_gets_its_pendulum_preset_by_the_env_and_cleanrls_mujoco_settings_by_name():
    """td3-pendulum is proven (docs/benchmarks/presets.md); td3-mujoco is CleanRL's settings, not measured here yet, and
    td3-mujoco-1m the same over the published budget: neither is chosen by naming the env."""
    config, preset = apply_preset("td3", td3.TD3Config(env="Pendulum-v1"))
    assert preset.name == "td3-pendulum" and config.max_env_steps == 20_000
    assert preset_stop_target("td3-pendulum", "Pendulum-v1") == -200.0
    assert find_preset("td3", "Hopper-v5") is None and find_preset("td3", "Hopper-v4") is None
    for name, env, budget in (("td3-mujoco", "Hopper-v5", 150_000), ("td3-mujoco-1m", "Walker2d-v4", 1_000_000)):
        config, preset = apply_preset("td3", td3.TD3Config(env=env, preset=name))
        assert preset.name == name and config.max_env_steps == budget and preset_target(name) is None
        assert (config.n_envs, config.hidden_sizes, config.batch_size, config.lr, config.learning_starts) == (
            1, (256, 256), 256, 3e-4, 25_000)
        assert (config.tau, config.policy_delay, config.exploration_noise, config.target_noise,
                config.target_noise_clip) == (0.005, 2, 0.1, 0.2, 0.5)
    assert not config.stop_at_reward_threshold and config.eval_every == 6_250 and config.n_evaluation_envs == 8
    with pytest.raises(ConfigError, match="preset 'td3-mujoco-1m' is for td3 on"):
        apply_preset("td3", td3.TD3Config(env="Hopper-v5", preset="td3-mujoco-1m"))


def test_an_exact_id_wins_over_a_family_and_unknown_envs_have_none():
    assert find_preset("ppo", "MinAtar/Breakout-v1").name == "ppo-minatar"
    assert find_preset("dqn", "MinAtar/Breakout-v1").name == "dqn-minatar"
    assert find_preset("ppo", "Hopper-v5").name == "ppo-mujoco"
    assert find_preset("sac", "Walker2d-v5").name == "sac-mujoco"
    assert find_preset("ppo", "NoSuchEnv-v0") is None
    assert find_preset("dqn", "Pendulum-v1") is None


# --------------------------------------------------------------------------- Python
def test_the_preset_fills_the_fields_not_given_and_a_given_one_wins():
    config, preset = apply_preset("ppo", ppo.PPOConfig(env="Pendulum-v1", lr=1e-3, seed=3))
    assert preset is PENDULUM and config.preset == "ppo-pendulum"
    assert config.lr == 1e-3 and config.seed == 3  # given
    assert (config.gamma, config.n_steps, config.max_env_steps) == (0.9, 250, 100_000)  # the preset's
    assert config.clip_coef == ppo.PPOConfig.clip_coef  # neither: the default


def test_a_value_equal_to_the_default_wins_when_the_caller_names_it_given():
    config = ppo.PPOConfig(env="Pendulum-v1", gamma=ppo.PPOConfig.gamma)
    assert apply_preset("ppo", config)[0].gamma == PENDULUM.settings["gamma"]  # not told: the default is not given
    config, _ = apply_preset("ppo", config, frozenset({"env", "gamma"}))
    assert config.gamma == ppo.PPOConfig.gamma != PENDULUM.settings["gamma"]


def test_a_config_that_changes_its_preset_env_kwargs_in_place_leaves_the_table_as_it_was():
    config, preset = apply_preset("dqn", dqn.DQNConfig(env="ALE/Breakout-v5"))
    config.env_kwargs["repeat_action_probability"] = 0.0
    assert preset.settings["env_kwargs"] == {"life_loss_info": True}
    assert find_preset("ppo", "ALE/Breakout-v5").settings["env_kwargs"] == {"life_loss_info": True}


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_a_preset_chooses_the_lstm_where_the_observation_hides_the_state_and_a_given_false_wins(algo):
    config, preset = apply_preset(algo, CONFIGS[algo](env="CartPoleNoVel-v1"))
    assert preset.name == f"{algo}-cartpolenovel" and config.recurrent is True
    config, _ = apply_preset(algo, CONFIGS[algo](env="CartPoleNoVel-v1", recurrent=False), {"env", "recurrent"})
    assert config.recurrent is False and config.preset == f"{algo}-cartpolenovel"
    assert apply_preset(algo, CONFIGS[algo](env="CartPole-v1"))[0].recurrent is False


def test_none_keeps_the_bare_defaults_and_a_resolved_config_resolves_to_itself():
    bare, preset = apply_preset("ppo", ppo.PPOConfig(env="Pendulum-v1", preset="none"))
    assert preset is None and bare.preset == "none" and bare.gamma == ppo.PPOConfig.gamma
    resolved, _ = apply_preset("ppo", ppo.PPOConfig(env="Pendulum-v1"))
    again, preset = apply_preset("ppo", resolved)
    assert again == resolved and preset is PENDULUM
    assert apply_preset("ppo", ppo.PPOConfig(env="CartPole-v1", preset="auto"))[0].preset in {
        "none", getattr(find_preset("ppo", "CartPole-v1"), "name", None)}


def test_given_fields_are_those_off_their_default_and_survive_pickling_and_replace():
    config = ppo.PPOConfig(env="Pendulum-v1", lr=1e-3)
    assert given_fields(config) == {"env", "lr"}
    assert given_fields(pickle.loads(pickle.dumps(config))) == {"env", "lr"}
    assert given_fields(dataclasses.replace(config, seed=1)) == {"env", "lr", "seed"}


@pytest.mark.parametrize("name, match", [
    ("no-such-preset", r"preset must be 'auto', 'none' or one of \[.*'ppo-pendulum'.*\] for ppo, got 'no-such-preset'"),
    ("ppo-pendulum", r"preset 'ppo-pendulum' is for ppo on \['Pendulum-v1'\], got ppo on 'CartPole-v1'"),
    ("sac-pendulum", r"preset 'sac-pendulum' is for sac on \['Pendulum-v1'\], got ppo on 'CartPole-v1'"),
])
def test_a_preset_of_another_env_or_algorithm_or_an_unknown_one_is_a_config_error(name, match):
    with pytest.raises(ConfigError, match=match):
        validate(ppo.ALGORITHM, ppo.PPOConfig(env="CartPole-v1", preset=name))


def test_an_unsupported_pair_keeps_the_defaults_and_says_what_learns_the_env(caplog):
    with caplog.at_level(logging.WARNING, logger="rlstruct.algos._train.presets"):
        setup = validate(a2c.ALGORITHM, a2c.A2CConfig(env="Pendulum-v1"))
    assert setup.config.preset == "none" and setup.config.gamma == a2c.A2CConfig.gamma
    assert "a2c on Pendulum-v1 has no preset" in caplog.text and "rlstruct train ppo --env Pendulum-v1" in caplog.text


def test_validate_hands_the_loop_the_resolved_config():
    setup = validate(ppo.ALGORITHM, ppo.PPOConfig(env="Pendulum-v1", lr=1e-3))
    assert setup.config.preset == "ppo-pendulum" and setup.config.n_steps == 250 and setup.config.lr == 1e-3


# --------------------------------------------------------------------------- the command line
def test_show_config_prints_every_setting_and_where_it_came_from(capsys):
    out = rlstruct_in_process(capsys, "train", "ppo", "--env", "Pendulum-v1", "--lr", "1e-3", "--show-config")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line.startswith("--")}
    assert rows["--env"] == ["Pendulum-v1", "flag"] and rows["--lr"] == ["0.001", "flag"]
    assert rows["--gamma"] == ["0.9", "preset", "ppo-pendulum"]
    assert rows["--n-steps"] == ["250", "preset", "ppo-pendulum"]
    assert rows["--clip-coef"] == ["0.2", "default"]
    assert rows["--preset"] == ["ppo-pendulum", "default", "(auto)"]
    assert len(rows) == len(dataclasses.fields(ppo.PPOConfig))
    assert out.stdout.startswith("# rlstruct train ppo --env Pendulum-v1: preset ppo-pendulum: tuned to reach -200")
    bare = rlstruct_in_process(capsys, "train", "ppo", "--env", "Pendulum-v1", "--preset", "none", "--show-config")
    bare_rows = {line.split()[0]: line.split()[1:] for line in bare.stdout.splitlines() if line.startswith("--")}
    assert bare_rows["--gamma"] == ["0.99", "default"] and bare_rows["--preset"] == ["none", "flag"]
    assert "no preset: the defaults and the settings given" in bare.stdout
    kwargs = rlstruct_in_process(capsys, "train", "ppo", "--env", "CartPole-v1", "--env-kwargs",
                                 '{"sutton_barto_reward": true}', "--show-config")
    row = next(ln for ln in kwargs.stdout.splitlines() if ln.startswith("--env-kwargs "))
    assert row.split() == ["--env-kwargs", '{"sutton_barto_reward":', "true}", "flag"], row


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.target is not None or p.measured is not None],
                         ids=lambda p: p.name)
def test_show_config_never_calls_a_preset_with_a_target_or_a_measurement_unproven(preset):
    """``--show-config``'s first line is :func:`describe_preset`'s: a preset that trains for its whole budget (no
    stopping target) but whose benchmark measured it says what was measured."""
    line = describe_preset(preset)
    assert "not proven" not in line, line
    if preset.target is None:
        assert line.endswith(f"measured: {preset.measured}"), line


def test_a_bad_preset_on_the_command_line_is_one_line_and_status_2(capsys):
    out = rlstruct_in_process(capsys, "train", "ppo", "--env", "CartPole-v1", "--preset", "ppo-pendulum",
                              "--show-config")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "preset 'ppo-pendulum' is for ppo on ['Pendulum-v1']" in out.stderr and "--preset none" in out.stderr


def test_presets_command_lists_the_table(capsys):
    out = rlstruct_in_process(capsys, "presets")
    assert out.returncode == 0 and all(p.name in out.stdout for p in PRESETS)
    row = next(line.split() for line in out.stdout.splitlines() if line.startswith("ppo-pendulum "))
    assert row[4] == str(preset_target("ppo-pendulum")).removesuffix(".0") == "-200", \
        "the table's target is the one a run's summary records"
    assert "target: the evaluation return the preset's learning benchmark reaches within the budget" in out.stdout
    assert preset_target("none") is None and preset_target("a2c-pendulum") is None


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.target is not None and not p.unsupported],
                         ids=lambda p: p.name)
def test_every_preset_that_names_a_target_stops_at_it_on_the_env_it_was_measured_on(preset):
    """A run of a preset stops at its target (MinAtar's and Atari's included), unless ``target_return`` names another
    or ``stop_at_reward_threshold`` is off; on a family's other envs the target (Breakout's) sets no stop."""
    env = preset.target_env or preset.envs[0]
    spec = EnvSpec((4,), "float32", 2, 500, reward_threshold=123.0)  # an env threshold the preset's target overrides
    config = CONFIGS[preset.algo](env=env, preset=preset.name)
    assert preset_stop_target(preset.name, env) == preset.target == run_target(config, spec)
    assert run_target(dataclasses.replace(config, target_return=7.0), spec) == 7.0
    assert run_target(dataclasses.replace(config, stop_at_reward_threshold=False), spec) is None
    assert run_target(dataclasses.replace(config, preset="none"), spec) == 123.0
    if "*" in preset.envs[0]:
        other = preset.envs[0].replace("*", "Pong-v1")
        assert preset_stop_target(preset.name, other) is None
        assert run_target(dataclasses.replace(config, env=other), spec) == 123.0


def test_the_family_presets_name_the_env_of_their_target():
    assert {p.name: p.target_env for p in PRESETS if p.target is not None and any("*" in e for e in p.envs)} == {
        "dqn-minatar": "MinAtar/Breakout-v1", "pqn-minatar": "MinAtar/Breakout-v1",
        "ppo-minatar": "MinAtar/Breakout-v1", "ppo-atari": "ALE/Breakout-v5", "dqn-atari": "ALE/Breakout-v5"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_records_its_preset_and_a_resumed_run_keeps_it(tmp_path, capsys):
    """Both runs are the console script's code in this process (what the preset does to their flags, summaries and
    folder is what this test reads), of one iteration each: the preset's 16 envs x 250 steps, with one epoch over them
    (given, as the budget is)."""
    logdir = tmp_path / "run"
    common = ["--max-env-steps", "4000", "--n-evaluation-envs", "2", "--no-progress", "--no-tensorboard",
              "--evaluation-max-steps", "50", "--n-epochs", "1"]
    first = rlstruct_in_process(capsys, "train", "ppo", "--env", "Pendulum-v1", "--logdir", str(logdir), *common)
    assert first.returncode == 0, first.stderr
    summary = last_json(first.stdout)
    assert summary["preset"] == "ppo-pendulum"
    # Pendulum-v1 has no reward threshold: the preset's target is the run's, which 4,000 env steps do not reach.
    assert summary["preset_target"] == -200.0 and summary["target_return"] == -200.0
    assert summary["stop_reason"] == "budget" and not summary["reached_target"]
    assert ": below the target -200" in first.stdout and "preset ppo-pendulum's target" not in first.stdout
    assert json.loads((logdir / "summary.json").read_text())["preset_target"] == -200.0
    saved = json.loads((logdir / "config.json").read_text())
    assert saved["preset"] == "ppo-pendulum" and saved["n_steps"] == 250 and saved["max_env_steps"] == 4000
    shown = rlstruct_in_process(capsys, "train", "ppo", "--resume", str(logdir), "--max-env-steps", "8000",
                                "--show-config")
    rows = {line.split()[0]: line.split()[1:] for line in shown.stdout.splitlines() if line.startswith("--")}
    assert rows["--n-steps"] == ["250", "resumed", "run"] and rows["--max-env-steps"] == ["8000", "flag"]
    assert rows["--preset"] == ["ppo-pendulum", "resumed", "run"]
    second = rlstruct_in_process(capsys, "train", "ppo", "--resume", str(logdir), "--max-env-steps", "8000",
                                 *common[2:])
    assert second.returncode == 0, second.stderr
    assert last_json(second.stdout)["preset"] == "ppo-pendulum" and last_json(second.stdout)["env_steps"] == 8000


# --------------------------------------------------------------------------- learning, by naming the env
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ppo_acrobot_preset_reaches_minus_100(tmp_path):
    """Seed 7 reaches -100 within 32k env steps. Seeds 0-9 (benchmarks/thresholds.py ppo-acrobot-preset) all did,
    with 1 torch thread and with 2, at 10,240-18,432 env steps (seed 7: 10,240 with either, the earliest, and on an
    AMD EPYC with 1 thread too, where seed 0 took 18,432 as before), confirmed at -74.7 to -98.5: the budget is 78%
    above the latest.
    One seed here checks that the preset still learns; the spread over seeds is the benchmark's (and
    docs/benchmarks/presets.md's, 5/5 seeds at 8k-16k)."""
    result = ppo.train(ppo.PPOConfig(env="Acrobot-v1", seed=7, target_return=-100.0, max_env_steps=32_768,
                                     logdir=str(tmp_path), progress=False, tensorboard=False))
    assert result.preset == "ppo-acrobot" and result.reached_target, result.eval_return


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ppo_pendulum_preset_nears_minus_200_within_its_budget(tmp_path):
    """The ppo-pendulum preset's run (100k env steps, stopping at a confirmed -200). Seeds 0-9
    (benchmarks/thresholds.py ppo-pendulum-preset) all reached -200, with 1 torch thread and with 2, 18 of the 20
    runs at 68k-88k env steps and seed 1 only at the budget's end; best evaluations -192.4 to -129.6, reported
    (confirmed or final) -199.6 to -159.5. Reaching -200 itself held with 0.4 to spare on the closest run, so the test
    asks for a best evaluation of -250 and a reported -260 (30% under the lowest of each); that every seed reaches
    -200 is the presets page's claim (docs/benchmarks/presets.md, 5/5 seeds) and this benchmark's."""
    result = ppo.train(ppo.PPOConfig(env="Pendulum-v1", seed=0, target_return=-200.0, logdir=str(tmp_path),
                                     progress=False, tensorboard=False))
    evals = [r["eval/return"] for r in result.history if "eval/return" in r and r["eval/launch_env_steps"] > 0]
    assert result.preset == "ppo-pendulum" and result.env_steps <= 100_000
    assert max(evals) >= -250.0 and result.eval_return >= -260.0, (result.eval_return, evals)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ppo_mountaincar_preset_climbs_out_of_the_valley(tmp_path):
    """docs/benchmarks/presets.md: 5/5 seeds past -110 at 256k-589k env steps. Within 102k env steps, seeds 0-9
    with 1 and 2 torch threads (benchmarks/thresholds.py ppo-mountaincar-preset): 18 of 20 reached -140 (at 26k-77k
    env steps); seed 8's best evaluation was -144.6 with either. The target, -160, is 15 under that lowest best and 40
    above a random policy's -200."""
    result = ppo.train(ppo.PPOConfig(env="MountainCar-v0", seed=0, target_return=-160.0, max_env_steps=102_400,
                                     logdir=str(tmp_path), progress=False, tensorboard=False))
    assert result.preset == "ppo-mountaincar" and result.reached_target, result.eval_return


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_lunarlander_presets_run_through_the_box2d_extra(tmp_path):
    pytest.importorskip("Box2D", reason="the box2d extra is not installed: pip install 'rlstruct[box2d]'")
    common = dict(env="LunarLander-v3", n_evaluation_envs=2, evaluation_max_steps=20, progress=False,
                  tensorboard=False)
    # One short collection and update each: the presets' settings reach Box2D's envs and their networks; the sizes a
    # caller gives (a collection of 16 envs x 128 steps, one epoch over it) win over the preset's, as everywhere.
    result = ppo.train(ppo.PPOConfig(max_env_steps=2_048, n_steps=128, n_epochs=1, logdir=str(tmp_path / "ppo"),
                                     **common))
    assert result.preset == "ppo-lunarlander" and result.env_steps == 2_048
    saved = json.loads((tmp_path / "ppo" / "config.json").read_text())
    assert (saved["n_envs"], saved["n_minibatches"], saved["gamma"]) == (16, 256, 0.999)
    result = dqn.train(dqn.DQNConfig(max_env_steps=64, logdir=str(tmp_path / "dqn"), **common))
    assert result.preset == "dqn-lunarlander" and result.env_steps == 64


@pytest.mark.slow  # 3.2 CPU s on the reference CPU: slow is 1.5 s or more
def test_a_reader_that_leaves_early_ends_the_command_quietly():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).with_name("rlstruct")
    out = subprocess.run(f"'{script}' presets | head -c 10", shell=True, capture_output=True, text=True, timeout=60)
    assert out.stdout == "name      " and out.stderr == ""


def test_the_presets_results_page_is_the_one_its_runs_generate():
    import json
    from pathlib import Path

    from benchmarks.learning import presets_page

    pytest.importorskip("scipy.stats", reason="the page's IQM intervals need scipy: pip install 'rlstruct[stats]'")
    root = Path(__file__).resolve().parents[2]
    files = [json.loads(p.read_text()) for p in sorted((root / "benchmarks" / "results").glob("presets-*.json"))]
    page = presets_page(files)
    assert (root / "docs" / "benchmarks" / "presets.md").read_text() == page, (
        "docs/benchmarks/presets.md differs from what its runs give: regenerate it with "
        "python benchmarks/learning.py --presets-page benchmarks/results/presets-*.json")
    run = {r["suite"] for f in files for r in f["runs"]}
    # the published-budget presets' runs are on docs/benchmarks/published.md (benchmarks/published.py)
    assert all(f"preset:{p.name}" in run for p in PRESETS if p.auto and not p.unsupported), (
        "a preset without its 5-seed runs")


def test_show_config_gives_a_published_preset_what_its_benchmark_measured(capsys):
    out = rlstruct_in_process(capsys, "train", "ppo", "--env", "HalfCheetah-v4", "--preset", "ppo-halfcheetah-zoo",
                              "--show-config")
    assert out.returncode == 0, out.stderr
    head = out.stdout.splitlines()[0]
    assert "not proven" not in head
    assert head.endswith("measured: IQM 5,818 [5,254, 6,326] over 10 seeds on the zoo's protocol (final weights, 150 "
                         "episodes), beside the zoo's 5,819: docs/benchmarks/published.md"), head
