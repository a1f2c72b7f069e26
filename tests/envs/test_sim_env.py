"""The harness the torch-native simulators share (:class:`rlstruct.envs._sim_env.SimEnv`): every one of them runs on
it, none re-implements its step, its results or its state guards, and their errors are the same."""

from __future__ import annotations

import pytest
import torch

from rlstruct import DictTensor
from rlstruct.envs import Acrobot, CartPole, MountainCar, Pendulum
from rlstruct.envs._sim_env import SimEnv
from rlstruct.envs._torch_env import TorchVecEnv
from rlstruct.envs.minatar import MinAtarEnv
from rlstruct.envs.mujoco_torch_env import MujocoTorchEnv
from rlstruct.errors import EnvStateError

SIMULATORS = (TorchVecEnv, CartPole, Acrobot, MountainCar, Pendulum, MinAtarEnv, MujocoTorchEnv)
SHARED = ("step", "step_into", "close", "n_envs", "set_graph_state", "_reset_observation", "_autoreset_result",
          "_episodic_result", "_count_toward_jit", "_resume", "_running")


@pytest.mark.parametrize("cls", SIMULATORS, ids=lambda c: c.__name__)
def test_every_torch_simulator_runs_on_the_shared_harness(cls):
    assert issubclass(cls, SimEnv)
    for name in SHARED:
        assert getattr(cls, name) is getattr(SimEnv, name), f"{cls.__name__} re-implements {name}"


@pytest.mark.parametrize("make", [lambda: CartPole(2, seed=0), lambda: MinAtarEnv("Breakout", 2, seed=0)],
                         ids=["CartPole", "MinAtar"])
def test_the_harness_raises_the_same_errors_for_every_simulator(make):
    env = make()
    name = type(env).__name__
    with pytest.raises(EnvStateError, match=rf"{name}\.step was called before reset\(\)"):
        env.step(DictTensor({"action": torch.zeros(2, dtype=torch.int64)}))
    assert env.graph_state() is None
    with pytest.raises(EnvStateError, match=rf"set_graph_state needs an auto-reset env .*{name} has autoreset=False"):
        env.set_graph_state({})
    env.close()
    env.close()
    with pytest.raises(EnvStateError, match=rf"{name} is closed; build a new one"):
        env.reset()
