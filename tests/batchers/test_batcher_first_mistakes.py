"""First mistakes with a batcher's arguments and agent: each a typed error naming the argument and the fix."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlstruct import DictTensor
from rlstruct.batchers import RayBatcher, RL_Batcher
from rlstruct.errors import AgentOutputError, BatcherWorkerError, ConfigError
from tests.fakes import ConstantAgent, CountingEnv

EPISODIC = {"n_envs": 3, "autoreset": False, "episode_lengths": (9,)}
REPO = Path(__file__).resolve().parents[2]


class TensorAgent(ConstantAgent):
    """Returns the action tensor alone."""

    def __call__(self, state, observation, agent_info, history=None):
        return torch.zeros(observation.n_elems(), dtype=torch.long)


class StatelessAgent(ConstantAgent):
    """Returns its output without the state."""

    def __call__(self, state, observation, agent_info, history=None):
        return DictTensor({"action": torch.zeros(observation.n_elems(), dtype=torch.long)})


def gym_cartpole(seed):
    """A factory that builds gymnasium's own env, not a VecEnv."""
    import gymnasium as gym

    return gym.make("CartPole-v1")


@pytest.mark.parametrize("make", [RL_Batcher, RayBatcher])
def test_duplicate_seeds_are_refused_naming_seeds(make):
    with pytest.raises(ConfigError, match=r"seeds must be distinct.*seeds\[0\] and seeds\[1\] are both 0.*"
                                          r"seeds=\[0, 1\]"):
        make(3, ConstantAgent, {}, CountingEnv, EPISODIC, 2, [0, 0])


@pytest.mark.parametrize("make", [RL_Batcher, RayBatcher])
def test_an_agent_instance_as_create_agent_is_refused(make):
    with pytest.raises(TypeError, match=r"create_agent must be a class or function.*got an instance of ConstantAgent"
                                        r".*create_agent=ConstantAgent.*agent_args="):
        make(3, ConstantAgent(), {}, CountingEnv, EPISODIC, 0, [0])


@pytest.mark.parametrize("make", [RL_Batcher, RayBatcher])
def test_an_env_instance_as_create_env_is_refused(make):
    env = CountingEnv(**EPISODIC, seed=0)
    with pytest.raises(TypeError, match=r"create_env must be a class or function.*got an instance of CountingEnv"
                                        r".*create_env=CountingEnv.*create_env=make_env"):
        make(3, ConstantAgent, {}, env, EPISODIC, 0, [0])


def test_a_gymnasium_env_as_create_env_is_refused_naming_make_env():
    gym = pytest.importorskip("gymnasium")
    env = gym.make("CartPole-v1")
    with pytest.raises(TypeError, match=r"create_env must be .*got an instance of TimeLimit.*create_env=make_env, "
                                        r"env_args=\{'name': 'CartPole-v1'"):
        RL_Batcher(3, ConstantAgent, {}, env, {}, 0, [0])


def test_a_factory_returning_a_gymnasium_env_is_refused_naming_make_env():
    pytest.importorskip("gymnasium")
    with pytest.raises(BatcherWorkerError, match=r"create_env must build a VecEnv, got TimeLimit from gym_cartpole.*"
                                                 r"create_env=make_env"):
        RL_Batcher(3, ConstantAgent, {}, gym_cartpole, {}, 0, [0])


@pytest.mark.parametrize("name", ["agent_args", "env_args"])
def test_none_as_args_is_refused(name):
    kwargs = {"agent_args": {}, "env_args": EPISODIC, name: None}
    with pytest.raises(TypeError, match=rf"{name} must be a dict of keyword arguments, got None; pass {name}=\{{\}}"):
        RL_Batcher(3, ConstantAgent, kwargs["agent_args"], CountingEnv, kwargs["env_args"], 0, [0])


@pytest.mark.parametrize("n_processes", [0, 1])
@pytest.mark.parametrize("agent, got", [(TensorAgent, r"got a Tensor \(wrap it"),
                                        (StatelessAgent, r"got a DictTensor \(the state is missing\)")])
def test_an_agent_returning_the_wrong_thing_is_named_at_the_first_call(agent, got, n_processes):
    with pytest.raises(AgentOutputError, match=rf"{agent.__name__}.__call__ must return \(output, new_state\), two "
                                               rf"DictTensors.*{got}.*return e.g."):
        RL_Batcher(3, agent, {}, CountingEnv, EPISODIC, n_processes, [0])


@pytest.mark.slow  # 3.2 CPU s on the reference CPU: slow is 1.5 s or more
def test_an_in_process_failure_shows_its_message_and_the_users_frame_once(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent("""
        from rlstruct.batchers import RL_Batcher
        from tests.fakes import ConstantAgent, CountingEnv

        class Failing(ConstantAgent):
            def __call__(self, state, observation, agent_info, history=None):
                raise ValueError("the user's own mistake")

        RL_Batcher(3, Failing, {}, CountingEnv, {"n_envs": 2}, 0, [0])
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 1
    assert out.stderr.count('raise ValueError("the user\'s own mistake")') == 1, out.stderr
    assert "BatcherWorkerError: worker 0 (in process) raised ValueError" in out.stderr
