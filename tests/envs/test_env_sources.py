"""Envs from outside the package: ``make_env("MODULE:CALLABLE")`` builds a user's own ``VecEnv`` factory and
``make_env("module:Env-v0")`` imports the module that registers a gymnasium id, so that ``--env`` gives them the CLI,
the batchers and the harness; a name that does not resolve is one line naming it."""

from __future__ import annotations

import json
import sys
import textwrap

import gymnasium as gym
import pytest
import torch

from rlstruct.algos import describe_env
from rlstruct.envs import CartPole, DeviceEnv, make_env
from rlstruct.errors import ConfigError
from tests.helpers import rlstruct_in_process, user_module

LABSIM = textwrap.dedent('''
    """A lab's own simulator and a gymnasium registration, outside the package."""
    import gymnasium as gym

    from rlstruct.envs import CartPole

    CALLS = []


    def make(n_envs, **kwargs):
        CALLS.append(kwargs)
        return CartPole(n_envs, **kwargs)


    def cpu_only(n_envs, device, **kwargs):
        return CartPole(n_envs, **kwargs)


    def gymnasium_env(n_envs, **kwargs):
        return gym.make("CartPole-v1")


    gym.register("LabCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=123)
''')


@pytest.fixture
def labsim(tmp_path, monkeypatch):
    with user_module(tmp_path, "labsim", LABSIM, monkeypatch) as name:
        yield name
    gym.registry.pop("LabCartPole-v0", None)


def test_a_vecenv_factory_is_called_with_the_envs_arguments(labsim):
    env = make_env("labsim:make", 3, seed=7, env_index=2, autoreset=True, max_episode_steps=50,
                   backend_kwargs={"physics_dtype": torch.float32})
    assert isinstance(env, CartPole) and env.n_envs() == 3 and env.autoreset
    (call,) = sys.modules["labsim"].CALLS
    assert call == {"device": torch.device("cpu"), "seed": 7, "env_index": 2, "autoreset": True,
                    "max_episode_steps": 50, "physics_dtype": torch.float32}
    # the same envs as rlstruct's own simulator, seeded alike
    torch.testing.assert_close(env.reset()[0]["frame"], CartPole(3, seed=7, env_index=2).reset()[0]["frame"])
    assert describe_env("labsim:make", "auto", None).max_episode_steps == 500


@pytest.mark.cuda
def test_a_factory_env_on_another_device_is_wrapped(labsim):
    assert isinstance(make_env("labsim:make", 2, device="cuda"), CartPole)  # built where asked
    env = make_env("labsim:cpu_only", 2, device="cuda")
    assert isinstance(env, DeviceEnv) and env.reset()[0]["frame"].device.type == "cuda"


def test_a_gymnasium_id_of_a_module_is_registered_by_importing_it(labsim):
    env = make_env("labsim:LabCartPole-v0", 2, backend="auto", seed=0)
    assert env.reset()[0]["frame"].shape == (2, 4)
    assert describe_env("labsim:LabCartPole-v0", "auto", None).max_episode_steps == 123


@pytest.mark.parametrize(("name", "match"), [
    ("labsim:gymnasium_env", r"env='labsim:gymnasium_env' must return a rlstruct.envs.VecEnv, got "
                             r"gymnasium.wrappers.common.TimeLimit; subclass VecEnv .* or wrap gymnasium envs in "
                             r"rlstruct.envs.GymEnv"),
    ("labsim:nothing", r"env='labsim:nothing': module 'labsim' has no attribute 'nothing'"),
    ("nolab.sim:make", r"env='nolab.sim:make' names module 'nolab.sim', but no module named 'nolab' imports here"),
    ("nolab:Maze-v0", r"env='nolab:Maze-v0' names module 'nolab', but no module named 'nolab' imports here"),
])
def test_an_env_name_that_does_not_resolve_is_one_line(labsim, name, match):
    with pytest.raises(ConfigError, match=match):
        make_env(name, 2, backend="auto")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_outside_vecenv_factory_trains_through_env_and_its_run_evaluates(labsim, tmp_path, capsys):
    """``rlstruct train a2c --env labsim:make`` with a worker process, then ``rlstruct eval`` of its run with one:
    the spawned workers import the user's module by its name (spawn hands them this process's ``sys.path``, as a
    fresh interpreter gets it from ``PYTHONPATH``), and the evaluation imports it anew (forgotten after training).
    Both commands run through the entry point in this process: what is tested is the module's name reaching the
    workers and the saved run, not an interpreter's start."""
    run = tmp_path / "run"
    out = rlstruct_in_process(capsys, "train", "a2c", "--env", "labsim:make", "--n-envs", "4", "--n-processes", "1",
                              "--max-env-steps", "64", "--n-evaluation-envs", "2", "--logdir", str(run),
                              "--no-progress", "--no-tensorboard")
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((run / "config.json").read_text())["env"] == "labsim:make"
    assert json.loads(out.stdout.strip().splitlines()[-1])["env_steps"] == 64
    sys.modules.pop(labsim)
    evaluated = rlstruct_in_process(capsys, "eval", str(run), "--episodes", "2", "--n-processes", "1",
                                    "--trust-code")  # labsim: not installed
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "greedy episodes of labsim:make" in evaluated.stdout
