"""The actor-critic's network options (``activation``, ``log_std_init``, ``ortho_init``): their checks, that their
defaults build the network built before they existed, what each one changes, a saved run that uses them, and
rl-baselines3-zoo's HalfCheetah preset, which needs them."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch
from torch import nn

from rlstruct.algos import EnvSpec, a2c, load, ppo, reinforce
from rlstruct.algos._train.actor_critic import actor_critic_agent, actor_critic_model
from rlstruct.algos._train.checkpoints import DIGEST_KEY, content_digest
from rlstruct.algos._train.evaluation import evaluate_checkpoint
from rlstruct.algos._train.presets import apply_preset
from rlstruct.algos._train.session import validate
from rlstruct.algos.encoders import init_orthogonal
from rlstruct.algos.networks import build_actor_critic, check_network_options, mlp
from rlstruct.errors import ConfigError
from tests.helpers import rlstruct_in_process

PENDULUM = EnvSpec((3,), "float32", None, 200, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))
CARTPOLE = EnvSpec((4,), "float32", 2, 500)
PIXELS = EnvSpec((4, 84, 84), "uint8", 4, 1000)
TINY = {"n_envs": 2, "n_steps": 8, "n_epochs": 1, "n_minibatches": 1, "max_env_steps": 32, "hidden_sizes": (16,),
        "n_evaluation_envs": 2, "evaluation_max_steps": 20, "eval_every": 1000, "stop_at_reward_threshold": False,
        "progress": False, "tensorboard": False, "time_limit": 100.0, "preset": "none"}


def _seeded(factory, *args, **kwargs):
    torch.manual_seed(0)
    return factory(*args, **kwargs)


def _linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in (*model.actor, *model.critic) if isinstance(m, nn.Linear)]


def _assert_same_parameters(a: nn.Module, b: nn.Module, *, but: tuple[str, ...] = ()) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        if key not in but:
            assert torch.equal(sa[key], sb[key]), key


# --------------------------------------------------------------------------- the defaults: the network as before
def _tanh_mlp_as_before(sizes: list[int], out: int, out_gain: float) -> nn.Sequential:
    """The actor-critic's MLP as it was built before the options: orthogonal weights (gain sqrt(2) inside), tanh."""
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [init_orthogonal(nn.Linear(a, b), math.sqrt(2)), nn.Tanh()]
    layers.append(init_orthogonal(nn.Linear(sizes[-1], out), out_gain))
    return nn.Sequential(*layers)


@pytest.mark.parametrize("spec", [PENDULUM, CARTPOLE], ids=["continuous", "discrete"])
def test_the_defaults_build_the_network_built_before_the_options_parameter_by_parameter(spec):
    out = spec.action_dim if not spec.discrete else spec.n_actions
    torch.manual_seed(0)
    actor = _tanh_mlp_as_before([spec.obs_dim, 64, 64], out, 0.01)
    critic = _tanh_mlp_as_before([spec.obs_dim, 64, 64], 1, 1.0)
    expected = {**{f"actor.{k}": v for k, v in actor.state_dict().items()},
                **{f"critic.{k}": v for k, v in critic.state_dict().items()}}
    if not spec.discrete:
        expected["log_std"] = torch.zeros(spec.action_dim)
    for model in (_seeded(build_actor_critic, spec, (64, 64)),
                  _seeded(actor_critic_model, ppo.PPOConfig(hidden_sizes=(64, 64)), spec),
                  _seeded(actor_critic_model, a2c.A2CConfig(hidden_sizes=(64, 64)), spec)):
        got = model.state_dict()
        assert sorted(got) == sorted(expected)
        assert all(torch.equal(got[k], expected[k]) for k in expected)
        assert [type(m) for m in model.actor] == [type(m) for m in actor]
    config = ppo.PPOConfig()
    assert (config.activation, config.log_std_init, config.ortho_init) == ("tanh", 0.0, True)
    assert actor_critic_agent({}).keywords == {"activation": "tanh", "log_std_init": 0.0, "ortho_init": True}, (
        "a run saved before the options evaluates with the network it trained")


# --------------------------------------------------------------------------- what each option changes
def test_relu_changes_the_hidden_activation_and_no_weight():
    tanh = _seeded(build_actor_critic, PENDULUM, (16, 16))
    relu = _seeded(build_actor_critic, PENDULUM, (16, 16), activation="relu")
    _assert_same_parameters(tanh, relu)
    for net in (relu.actor, relu.critic):
        assert [type(m).__name__ for m in net] == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    w0, w1, w2 = (layer for layer in relu.actor if isinstance(layer, nn.Linear))
    by_hand = w2(torch.relu(w1(torch.relu(w0(x)))))
    torch.testing.assert_close(relu.policy(x).mean, by_hand)
    assert not torch.allclose(tanh.policy(x).mean, relu.policy(x).mean)


def test_log_std_init_sets_the_gaussians_initial_std_and_no_other_weight():
    base = _seeded(build_actor_critic, PENDULUM, (16,))
    model = _seeded(build_actor_critic, PENDULUM, (16,), log_std_init=-2.0)
    _assert_same_parameters(base, model, but=("log_std",))
    assert torch.equal(model.log_std.detach(), torch.tensor([-2.0])) and model.log_std.requires_grad
    std = model.policy(torch.zeros(4, 3)).log_std.exp()
    torch.testing.assert_close(std, torch.full((4, 1), math.exp(-2.0)))


def test_without_ortho_init_the_layers_keep_torchs_default_initialisation():
    model = _seeded(build_actor_critic, PENDULUM, (16, 16), ortho_init=False)
    torch.manual_seed(0)  # the actor's layers, then the critic's, as torch initialises them
    default = [nn.Linear(a, b) for a, b in ((3, 16), (16, 16), (16, 1), (3, 16), (16, 16), (16, 1))]
    for got, want in zip(_linears(model), default, strict=True):
        assert torch.equal(got.weight, want.weight) and torch.equal(got.bias, want.bias)
    assert torch.equal(model.log_std.detach(), torch.zeros(1))
    ortho = _seeded(build_actor_critic, PENDULUM, (16, 16))
    first = ortho.actor[0].weight  # [16, 3]: orthogonal columns of norm sqrt(2), zero biases
    torch.testing.assert_close(first.T @ first, 2.0 * torch.eye(3), rtol=0, atol=1e-5)
    assert all(not layer.bias.any() for layer in _linears(ortho))
    assert all(layer.bias.any() for layer in _linears(model))
    assert not torch.allclose(model.actor[0].weight.T @ model.actor[0].weight, 2.0 * torch.eye(3), atol=1e-2)


# --------------------------------------------------------------------------- what is refused
def test_an_unknown_activation_is_a_value_error_of_the_mlp():
    with pytest.raises(ValueError, match=re.escape("activation must be one of ['tanh', 'relu'], got 'gelu'")):
        mlp(4, (8,), 2, activation="gelu")


@pytest.mark.parametrize(("changes", "error", "match"), [
    ({"activation": "gelu"}, ValueError, "activation must be 'tanh' or 'relu', got 'gelu'"),
    ({"log_std_init": float("nan")}, ValueError, "log_std_init must be a finite number, got nan; pass a finite "
                                                 "--log-std-init (its default: 0.0)"),
    ({"env": "CartPole-v1", "log_std_init": -2.0}, ConfigError,
     "log_std_init=-2.0 sets the initial log standard deviation of a Gaussian policy, got an env with 2 discrete "
     "actions (a categorical policy, which has none); drop --log-std-init"),
    ({"env": "CartPoleNoVel-v1", "recurrent": True, "activation": "relu"}, ConfigError,
     "activation='relu' sets the feed-forward actor-critic's MLPs, got the LSTM network (recurrent=True), whose "
     "encoder and core have their own activation; drop --activation"),
    ({"env": "CartPoleNoVel-v1", "recurrent": True, "ortho_init": False}, ConfigError,
     "ortho_init=False sets the feed-forward actor-critic's MLPs, got the LSTM network (recurrent=True), whose "
     "encoder and core have their own initialisation; drop --no-ortho-init"),
    ({"env": "MinAtar/Breakout-v1", "activation": "relu"}, ConfigError,
     "activation='relu' sets the feed-forward actor-critic's MLPs, got image observations of shape (10, 10, 4), "
     "whose CNN encoder has its own activation; drop --activation"),
    ({"env": "MinAtar/Breakout-v1", "ortho_init": False}, ConfigError,
     "ortho_init=False sets the feed-forward actor-critic's MLPs, got image observations of shape (10, 10, 4), "
     "whose CNN encoder has its own initialisation; drop --no-ortho-init"),
])
def test_options_out_of_their_choices_or_that_the_envs_network_lacks_are_refused_before_the_run(changes, error,
                                                                                                match, tmp_path):
    config = ppo.PPOConfig(**{"env": "Pendulum-v1", "logdir": str(tmp_path / "run"), **changes})
    with pytest.raises(error, match=re.escape(match)):
        validate(ppo.ALGORITHM, config)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("algorithm", [a2c, reinforce], ids=["a2c", "reinforce"])
def test_every_actor_critic_algorithm_takes_the_options_and_refuses_the_same(algorithm, tmp_path):
    config_cls = algorithm.ALGORITHM.config_cls
    with pytest.raises(ConfigError, match=re.escape("log_std_init=-1.0 sets the initial log standard deviation")):
        validate(algorithm.ALGORITHM, config_cls(env="CartPole-v1", log_std_init=-1.0, logdir=str(tmp_path / "a")))
    setup = validate(algorithm.ALGORITHM, config_cls(env="Pendulum-v1", activation="relu", log_std_init=-1.0,
                                                     ortho_init=False, logdir=str(tmp_path / "b")))
    model = _seeded(actor_critic_model, setup.config, setup.spec)
    assert isinstance(model.actor[1], nn.ReLU) and torch.equal(model.log_std.detach(), torch.tensor([-1.0]))


def test_building_the_network_directly_refuses_the_same_options():
    with pytest.raises(ConfigError, match=re.escape("ortho_init=False sets the feed-forward actor-critic's MLPs, "
                                                    "got image observations of shape (4, 84, 84)")):
        build_actor_critic(PIXELS, (8,), ortho_init=False)
    with pytest.raises(ConfigError, match=re.escape("log_std_init=0.5 sets the initial log standard deviation")):
        build_actor_critic(CARTPOLE, (8,), log_std_init=0.5)
    check_network_options(PIXELS)  # the defaults pass everywhere
    check_network_options(CARTPOLE, recurrent=True)


def test_the_command_line_takes_the_options_as_flags(capsys):
    out = rlstruct_in_process(capsys, "train", "ppo", "--env", "Pendulum-v1", "--activation", "relu",
                              "--log-std-init", "-2", "--no-ortho-init", "--show-config")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split()[1:] for line in out.stdout.splitlines() if line.startswith("--")}
    assert rows["--activation"] == ["relu", "flag"] and rows["--log-std-init"] == ["-2.0", "flag"]
    assert rows["--ortho-init"] == ["False", "flag"]


# --------------------------------------------------------------------------- a saved run
OPTIONS = {"activation": "relu", "log_std_init": -1.5, "ortho_init": False}


@pytest.fixture(scope="module")
def relu_run(tmp_path_factory):
    """A tiny PPO run on Pendulum-v1 with every option off its default."""
    logdir = tmp_path_factory.mktemp("relu") / "run"
    ppo.train(ppo.PPOConfig(env="Pendulum-v1", logdir=str(logdir), **OPTIONS, **TINY))
    return logdir


@pytest.mark.timeout(120)
def test_a_saved_run_with_the_options_records_loads_evaluates_and_resumes_only_with_its_activation(relu_run):
    recorded = json.loads((relu_run / "config.json").read_text())
    assert {k: recorded[k] for k in OPTIONS} == OPTIONS

    policy = load(relu_run)
    model = policy.agent.model
    assert [type(m).__name__ for m in model.actor] == ["Linear", "ReLU", "Linear"]
    trained = torch.load(relu_run / "checkpoint.pt", weights_only=True)["model"]
    assert torch.equal(model.log_std, trained["log_std"]) and torch.equal(model.actor[0].weight,
                                                                          trained["actor.0.weight"])
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(0))
    w0, w1 = (layer for layer in model.actor if isinstance(layer, nn.Linear))
    expected = w1(torch.relu(w0(x))).clamp(-2.0, 2.0)
    torch.testing.assert_close(torch.as_tensor(policy.predict(x.numpy())), expected)

    result = evaluate_checkpoint(str(relu_run / "checkpoint.pt"), episodes=2, max_steps=20)
    assert result["episodes"] == 2 and math.isfinite(result["eval_return"])

    resumed = dataclasses.replace(ppo.PPOConfig(env="Pendulum-v1", **TINY), resume=str(relu_run), max_env_steps=64)
    with pytest.raises(ConfigError, match=re.escape("activation must equal the checkpoint's to resume it")):
        validate(ppo.ALGORITHM, resumed)


@pytest.mark.timeout(120)
def test_a_saved_run_with_the_options_exports_the_network_it_trained(relu_run, tmp_path):
    policy = load(relu_run)
    script = torch.jit.load(policy.export(tmp_path / "policy.pt"))
    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(script(x), torch.as_tensor(policy.predict(x.numpy())), rtol=0, atol=1e-6)


@pytest.mark.timeout(120)
def test_a_saved_run_with_the_options_records_a_video_of_its_network(relu_run, tmp_path):
    pytest.importorskip("pygame", reason="gymnasium's classic-control frames need pygame: pip install "
                                         "'rlstruct[video]'")
    from rlstruct.algos._train.checkpoints import load_checkpoint
    from rlstruct.algos._train.video import record_checkpoint_video, record_policy_video

    result = record_checkpoint_video(relu_run, tmp_path / "episode.gif", max_steps=5, seed=0)
    assert result.lengths == (5,) and result.frames == 6
    saved = load_checkpoint(relu_run)
    args = {"algo": "ppo", "env_spec": saved["env_spec"], "model_state": saved["model"], "max_steps": 5, "seed": 0}
    relu = record_policy_video(tmp_path / "relu.gif", config=saved["config"], **args)
    tanh = record_policy_video(tmp_path / "tanh.gif", config={**saved["config"], "activation": "tanh"}, **args)
    assert result.returns == relu.returns != tanh.returns, "the video's policy is the saved network, relu and all"


@pytest.mark.timeout(120)
def test_a_run_saved_before_the_options_evaluates_and_resumes_with_their_defaults(tmp_path):
    logdir = tmp_path / "run"
    ppo.train(ppo.PPOConfig(env="Pendulum-v1", logdir=str(logdir), **TINY))
    path = logdir / "checkpoint.pt"
    data = torch.load(path, weights_only=True)
    for name in ("activation", "log_std_init", "ortho_init"):  # a config written before these settings existed
        del data["config"][name]
    data[DIGEST_KEY] = content_digest(data)
    torch.save(data, path)

    assert [type(m).__name__ for m in load(logdir).agent.model.actor] == ["Linear", "Tanh", "Linear"]
    assert evaluate_checkpoint(str(path), episodes=2, max_steps=20)["episodes"] == 2
    resumed = dataclasses.replace(ppo.PPOConfig(env="Pendulum-v1", **TINY), resume=str(logdir), max_env_steps=64)
    assert validate(ppo.ALGORITHM, resumed).resume.env_steps == 32
    with pytest.raises(ConfigError, match=re.escape("got activation='relu' and the checkpoint's 'tanh' (resume=")):
        validate(ppo.ALGORITHM, dataclasses.replace(resumed, activation="relu"))


# --------------------------------------------------------------------------- rl-baselines3-zoo's HalfCheetah
def test_the_zoo_halfcheetah_preset_holds_the_zoos_settings_and_runs_only_when_named():
    config, preset = apply_preset("ppo", ppo.PPOConfig(env="HalfCheetah-v4", preset="ppo-halfcheetah-zoo"))
    assert preset.name == "ppo-halfcheetah-zoo" and not preset.auto and preset.target is None
    zoo = {"n_envs": 1, "n_steps": 512, "n_epochs": 20, "lr": 2.0633e-05, "anneal_lr": False, "gamma": 0.98,
           "gae_lambda": 0.92, "clip_coef": 0.1, "entropy_coef": 0.000401762, "max_grad_norm": 0.8,
           "normalize_observations": True, "normalize_rewards": True, "hidden_sizes": (256, 256),
           "activation": "relu", "log_std_init": -2.0, "ortho_init": False, "max_env_steps": 1_000_000,
           "stop_at_reward_threshold": False, "evaluation_policy": "greedy", "normalize_advantages": True,
           # SB3's PPO: Adam's epsilon; VecNormalize: observations stored as the policy saw them, the rewards'
           # scale from a return discounted at its own 0.99
           "adam_eps": 1e-5, "obs_stats_after_update": True, "normalize_rewards_gamma": 0.99}
    assert {k: getattr(config, k) for k in zoo} == zoo
    assert config.n_envs * config.n_steps // config.n_minibatches == 64, "the zoo's batch_size"
    # Stable-Baselines3's value loss is the squared error, rlstruct's half of it: the same gradient as vf_coef 0.58096
    assert config.value_coef == pytest.approx(2 * 0.58096) and config.reward_scale == 1.0
    assert apply_preset("ppo", ppo.PPOConfig(env="HalfCheetah-v4"))[1].name == "ppo-mujoco"
    with pytest.raises(ConfigError, match="preset 'ppo-halfcheetah-zoo' is for ppo on"):
        apply_preset("ppo", ppo.PPOConfig(env="Hopper-v4", preset="ppo-halfcheetah-zoo"))


@pytest.mark.slow  # 1.8 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
def test_the_zoo_halfcheetah_preset_validates_and_runs_on_halfcheetah_v4(tmp_path):
    pytest.importorskip("mujoco", reason="the mujoco extra is not installed: pip install 'rlstruct[mujoco]'")
    config = ppo.PPOConfig(env="HalfCheetah-v4", preset="ppo-halfcheetah-zoo", max_env_steps=512, n_evaluation_envs=2,
                           evaluation_max_steps=20, logdir=str(tmp_path / "run"), progress=False, tensorboard=False)
    result = ppo.train(config)
    assert result.env_steps == 512 and result.preset == "ppo-halfcheetah-zoo"
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (recorded["activation"], recorded["log_std_init"], recorded["ortho_init"]) == ("relu", -2.0, False)
    assert load(tmp_path / "run").agent.model.actor[0].weight.shape == (256, 17)
