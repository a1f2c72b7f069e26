"""``rlstruct export RUN``: the exported deterministic policy (ONNX run by onnxruntime, TorchScript by
``torch.jit.load``) acts as the loaded policy (``load(run).predict``) on a thousand observations, for a discrete, a
continuous, a pixel and a recurrent run (tiny budgets: the weights need not be good, only the same)."""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlstruct.algos import dqn, load, ppo, sac, td3
from rlstruct.algos._train import cli
from rlstruct.errors import CheckpointError, MissingDependencyError
from tests import fakes_pixels

pytestmark = pytest.mark.timeout(300)
fakes_pixels.register()

SMALL = {"hidden_sizes": (8,), "progress": False, "tensorboard": False, "n_evaluation_envs": 2, "eval_every": 1000,
         "max_episode_steps": 20, "stop_at_reward_threshold": False, "time_limit": 100.0, "preset": "none"}
ON_POLICY = {**SMALL, "n_envs": 4, "n_steps": 8, "n_epochs": 1, "n_minibatches": 1, "max_env_steps": 64}
RUNS = {
    # discrete actions, normalised observations (the statistics must travel with the file)
    "discrete": (ppo.train, ppo.PPOConfig(env="CartPole-v1", normalize_observations=True, **ON_POLICY)),
    # continuous actions: a Gaussian's mean clipped to the bounds, normalised observations
    "continuous": (ppo.train, ppo.PPOConfig(env="Pendulum-v1", normalize_observations=True, **ON_POLICY)),
    "pixels": (ppo.train, ppo.PPOConfig(env="LitSide-v0", backend="gymnasium", **ON_POLICY)),
    "recurrent": (ppo.train, ppo.PPOConfig(env="CartPole-v1", recurrent=True, normalize_observations=True,
                                           **ON_POLICY)),
    # the other agents' greedy policies: SAC's squashed mean, TD3's mu(s), DQN's argmax
    "sac": (sac.train, sac.SACConfig(env="Pendulum-v1", n_envs=2, rollout_steps=4, learning_starts=16, batch_size=8,
                                     max_env_steps=32, **SMALL)),
    "td3": (td3.train, td3.TD3Config(env="Pendulum-v1", n_envs=2, rollout_steps=4, learning_starts=16, batch_size=8,
                                     max_env_steps=32, **SMALL)),
    "dqn": (dqn.train, dqn.DQNConfig(env="CartPole-v1", n_envs=2, rollout_steps=4, learning_starts=16, batch_size=8,
                                     max_env_steps=32, **SMALL)),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("runs")
    out = {}
    for name, (train, config) in RUNS.items():
        out[name] = str(folder / name)
        train(dataclasses.replace(config, logdir=out[name]))
    return out


def _observations(env: str, n: int) -> np.ndarray:
    space = gym.make(env).observation_space
    space.seed(0)
    return np.stack([space.sample() for _ in range(n)])


def _check(policy, actions: np.ndarray, expected: np.ndarray) -> None:
    if policy.spec.discrete:
        assert actions.dtype == np.int64 and np.array_equal(actions, expected)
    else:
        assert actions.shape == expected.shape
        np.testing.assert_allclose(actions, expected, rtol=0, atol=1e-5)


def assert_exports_act_as_loaded(policy, onnx_file, torchscript_file) -> None:
    """The ONNX file (run by onnxruntime) and the TorchScript one (by ``torch.jit.load``) act as ``policy``, the
    loaded run, on a thousand observations; a recurrent policy's over 100 episodes of 10 steps."""
    ort = pytest.importorskip("onnxruntime", reason="needs the export extra")
    onnx = ort.InferenceSession(str(onnx_file))
    script = torch.jit.load(str(torchscript_file))
    if not policy.recurrent:
        obs = _observations(policy.config["env"], 1000)
        expected = policy.predict(obs)
        _check(policy, onnx.run(None, {"observation": obs})[0], expected)
        _check(policy, script(torch.as_tensor(obs)).numpy(), expected)
        return
    # The memory goes from one call to the next as explicit inputs and outputs.
    obs = _observations(policy.config["env"], 1000).reshape(10, 100, -1)
    state = None
    h = np.zeros((100, policy.agent.model.core_size), np.float32)
    c, th, tc = h.copy(), torch.as_tensor(h), torch.as_tensor(h)
    for step in obs:
        expected, state = policy.predict(step, state=state)
        action, h, c = onnx.run(None, {"observation": step, "h": h, "c": c})
        _check(policy, action, expected)
        np.testing.assert_allclose(h, state["h"].numpy(), rtol=0, atol=1e-5)
        action, th, tc = script(torch.as_tensor(step), th, tc)
        _check(policy, action.numpy(), expected)


@pytest.mark.slow  # 6.5 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.parametrize("name", [name for name in RUNS if name != "discrete"])
def test_the_exported_policy_acts_as_the_loaded_one(runs, name, tmp_path):
    """``policy.export`` of each kind of run; the discrete run's files are the command's, checked in
    :func:`test_rlstruct_export_writes_the_file_and_a_json_line` (an ONNX export costs seconds: one a run)."""
    pytest.importorskip("onnxruntime", reason="needs the export extra")
    pytest.importorskip("onnxscript", reason="needs the export extra")
    policy = load(runs[name])
    assert_exports_act_as_loaded(policy, policy.export(tmp_path / "policy.onnx"),
                                 policy.export(tmp_path / "policy.pt"))


@pytest.mark.slow  # 1.9 CPU s on the reference CPU: slow is 1.5 s or more
def test_rlstruct_export_writes_the_file_and_a_json_line(runs, tmp_path, capsys):
    """The command's two files, ONNX and TorchScript, of the discrete run: written as asked, and acting as the
    loaded policy."""
    pytest.importorskip("onnxruntime", reason="needs the export extra")
    pytest.importorskip("onnxscript", reason="needs the export extra")
    output = tmp_path / "deploy" / "cartpole.onnx"
    assert cli.main(["export", runs["discrete"], "--output", str(output)]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["format"] == "onnx" and output.is_file()
    # One self-contained file (no weights in a .data file beside it), and no exporter notes on the console.
    assert [p.name for p in output.parent.iterdir()] == ["cartpole.onnx"]
    assert "Warning" not in err and "torchvision" not in err, err
    assert cli.main(["export", runs["discrete"], "--output", str(tmp_path / "p.onnx"), "--format", "torchscript"]) == 0
    assert torch.jit.load(str(tmp_path / "p.onnx"))(torch.zeros(3, 4)).shape == (3,)
    assert_exports_act_as_loaded(load(runs["discrete"]), output, tmp_path / "p.onnx")


def test_export_errors_name_the_fix(runs, tmp_path, monkeypatch, capsys):
    assert cli.main(["export", str(tmp_path / "nothing"), "--output", str(tmp_path / "p.onnx")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(CheckpointError, match="does not exist"):
        load(tmp_path / "nothing")
    with pytest.raises(ValueError, match="format must be one of"):
        load(runs["discrete"]).export(tmp_path / "p.x", format="tflite")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlstruct\[export\]'"):
        load(runs["discrete"]).export(tmp_path / "p.onnx")
