"""``evaluation_policy``: evaluations, videos and ``rlstruct eval`` act greedily (the default) or as in training.

One map (``evaluation_info``) gives every algorithm's evaluation ``agent_info``; the
loops, the videos and ``rlstruct eval`` take theirs from it. The agents are checked against what the policy says:
a greedy agent takes the mode, a sampling one draws with the policy's probabilities.
"""

from __future__ import annotations

import json

import pytest
import torch

from rlstruct.algos import EnvSpec, dqn, ppo, sac
from rlstruct.algos._train import loops
from rlstruct.algos._train.config import RunConfig, validate_run_config
from rlstruct.algos._train.evaluation import evaluation_agent
from rlstruct.algos._train.loops import train_off_policy, train_on_policy
from rlstruct.algos._train.registry import algorithm
from rlstruct.algos._train.session import validate
from rlstruct.algos.dqn import DQNConfig
from rlstruct.algos.ppo import PPOConfig
from rlstruct.algos.sac import SACConfig
from rlstruct.structures import DictTensor
from tests.helpers import rlstruct_in_process

SPEC = EnvSpec((4,), "float32", 2, 500)


@pytest.mark.parametrize(("algo", "config", "info"), [
    ("ppo", {}, {"stochastic": False}),  # a config without the setting: greedy
    ("a2c", {"evaluation_policy": "sample"}, {"stochastic": True}),
    ("reinforce", {"evaluation_policy": "greedy"}, {"stochastic": False}),
    ("dqn", {"evaluation_policy": "greedy", "epsilon_end": 0.05}, {"epsilon": 0.0}),
    ("dqn", {"evaluation_policy": "sample", "epsilon_end": 0.01}, {"epsilon": 0.01}),
    ("sac", {"evaluation_policy": "sample"}, {"stochastic": True, "random": False}),
    ("sac", {}, {"stochastic": False, "random": False}),
    ("td3", {"evaluation_policy": "sample", "exploration_noise": 0.2}, {"noise": 0.2, "random": False}),
    ("td3", {"exploration_noise": 0.2}, {"noise": 0.0, "random": False}),
])
def test_each_algorithms_evaluation_info_follows_the_runs_policy(algo, config, info):
    assert algorithm(algo).evaluation_agent_info(config) == info


def test_an_unknown_policy_is_a_value_error_naming_the_setting_and_the_choices():
    with pytest.raises(ValueError, match=r"evaluation_policy must be one of \['greedy', 'sample'\], got 'mode'"):
        validate_run_config(RunConfig(evaluation_policy="mode"))
    with pytest.raises(ValueError, match=r"policy must be one of \['greedy', 'sample'\], got 'best'"):
        evaluation_agent("ppo", {"hidden_sizes": [8]}, SPEC, policy="best")


def _actions(policy: str | None, config: dict, n: int = 4000) -> torch.Tensor:
    """The actions of an evaluation agent of ``config`` whose network scores both actions alike but for a small
    bias towards action 1 (probabilities 0.4 / 0.6)."""
    create, kwargs, info = evaluation_agent("ppo", {"hidden_sizes": [8], **config}, SPEC, policy=policy)
    agent = create(**kwargs)
    state = {k: torch.zeros_like(v) for k, v in agent.model.state_dict().items()}
    bias = [k for k in state if k.startswith("actor.") and k.endswith("bias") and state[k].shape == (2,)]
    assert len(bias) == 1, sorted(state)
    state[bias[0]] = torch.tensor([0.0, float(torch.log(torch.tensor(1.5)))])
    agent.update(state)
    agent.seed(0)
    obs = DictTensor({"frame": torch.randn(n, 4)})
    rows = DictTensor({k: v.expand(n) for k, v in info.items()})
    return agent(None, obs, rows)[0]["action"]


def test_a_greedy_evaluation_takes_the_mode_and_a_sampled_one_draws_with_the_policys_probabilities():
    assert torch.equal(_actions(None, {}), torch.ones(4000, dtype=torch.int64))  # the run's default: greedy
    sampled = _actions(None, {"evaluation_policy": "sample"})
    assert abs(sampled.float().mean().item() - 0.6) < 0.03  # 4,000 draws: 4 standard deviations is 0.031
    # rlstruct eval --policy overrides the run's choice, both ways
    assert torch.equal(_actions("greedy", {"evaluation_policy": "sample"}), torch.ones(4000, dtype=torch.int64))
    assert torch.equal(_actions("sample", {}), sampled)


class _Opened(Exception):
    pass


@pytest.mark.parametrize(("train", "config", "expected"), [
    (train_on_policy, PPOConfig(env="CartPole-v1", evaluation_policy="sample", preset="none"), {"stochastic": True}),
    (train_on_policy, PPOConfig(env="CartPole-v1", preset="none"), {"stochastic": False}),
    (train_off_policy, DQNConfig(env="CartPole-v1", evaluation_policy="sample", epsilon_end=0.02), {"epsilon": 0.02}),
    (train_off_policy, SACConfig(env="Pendulum-v1", evaluation_policy="sample"), {"stochastic": True, "random": False}),
])
def test_the_training_loops_hand_their_evaluator_the_runs_policy(train, config, expected, monkeypatch, tmp_path):
    seen = {}

    def opened(*args, evaluate, **kwargs):
        seen.update(evaluate)
        raise _Opened

    monkeypatch.setattr(loops, "open_batchers", opened)
    config.logdir = str(tmp_path)
    config.progress = config.tensorboard = False
    algorithm = {PPOConfig: ppo, DQNConfig: dqn, SACConfig: sac}[type(config)].ALGORITHM
    with pytest.raises(_Opened):
        train(validate(algorithm, config))
    assert seen == expected


def test_the_atari_preset_evaluates_whole_games_of_the_sampled_policy():
    config = validate(ppo.ALGORITHM, PPOConfig(env="ALE/Breakout-v5")).config if _has_ale() else None
    if config is None:
        pytest.skip("ale-py is not installed (pip install 'rlstruct[atari]')")
    assert config.preset == "ppo-atari" and config.evaluation_policy == "sample"
    assert config.env_kwargs == {"life_loss_info": True} and config.evaluation_env_kwargs is None
    assert (config.n_envs, config.n_steps, config.n_epochs, config.n_minibatches) == (8, 128, 4, 4)
    assert (config.clip_coef, config.value_clip, config.reward_scale, config.max_env_steps) == (0.1, 0.1, 1.0, 10**7)


def test_dqns_atari_preset_evaluates_whole_games_epsilon_greedy():
    if not _has_ale():
        pytest.skip("ale-py is not installed (pip install 'rlstruct[atari]')")
    config = validate(dqn.ALGORITHM, DQNConfig(env="ALE/Breakout-v5")).config
    assert config.preset == "dqn-atari" and config.evaluation_policy == "sample" and config.epsilon_end == 0.01
    assert config.env_kwargs == {"life_loss_info": True} and config.evaluation_env_kwargs is None
    # one gradient step of 32 transitions per 4 env steps, as in CleanRL's dqn_atari.py
    assert config.gradient_steps * 4 == config.n_envs * config.rollout_steps and config.batch_size == 32
    assert (config.learning_starts, config.epsilon_decay_steps, config.n_step) == (20_000, 250_000, 3)


def test_a_greedy_evaluation_of_whole_atari_games_is_warned_about(caplog):
    if not _has_ale():
        pytest.skip("ale-py is not installed (pip install 'rlstruct[atari]')")
    warned = "plays until that cap"
    with caplog.at_level("WARNING", logger="rlstruct.algos._train.session"):
        validate(ppo.ALGORITHM, PPOConfig(env="ALE/Breakout-v5", preset="none"))
    assert warned in caplog.text and "--evaluation-policy sample" in caplog.text and "27000 steps" in caplog.text
    for quiet in (PPOConfig(env="ALE/Breakout-v5"), PPOConfig(env="ALE/Breakout-v5", preset="none",
                                                              evaluation_max_steps=1000),
                  PPOConfig(env="CartPole-v1", preset="none")):
        caplog.clear()
        with caplog.at_level("WARNING", logger="rlstruct.algos._train.session"):
            validate(ppo.ALGORITHM, quiet)
        assert warned not in caplog.text, quiet


def _has_ale() -> bool:
    import importlib.util

    return importlib.util.find_spec("ale_py") is not None


@pytest.mark.timeout(240)
def test_rlstruct_eval_reports_the_policy_it_ran_and_refuses_an_unknown_one(tmp_path, capsys):
    """The commands in this process (their code, not a fresh interpreter's start, is what is checked): a tiny run
    that records ``sample``, then eval with the run's policy, with each one named, and with one that is not."""
    out = rlstruct_in_process(capsys, "train", "ppo", "--env", "CartPole-v1", "--max-env-steps", "512",
                              "--evaluation-policy", "sample", "--logdir", str(tmp_path), "--no-progress",
                              "--no-tensorboard")
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads((tmp_path / "config.json").read_text())["evaluation_policy"] == "sample"
    runs = {}
    for flags in ([], ["--policy", "greedy"], ["--policy", "sample"]):
        out = rlstruct_in_process(capsys, "eval", str(tmp_path), "--episodes", "8", *flags)
        assert out.returncode == 0, out.stderr[-2000:]
        runs[tuple(flags)] = json.loads(out.stdout.strip().splitlines()[-1])
        assert f"{runs[tuple(flags)]['policy']} episodes of CartPole-v1" in out.stdout
    assert runs[()]["policy"] == "sample" and runs[("--policy", "greedy")]["policy"] == "greedy"
    assert runs[()] == runs[("--policy", "sample")]  # the run's own policy, with the same seed
    bad = rlstruct_in_process(capsys, "eval", str(tmp_path), "--policy", "mode")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "--policy" in bad.stderr and "'mode'" in bad.stderr
