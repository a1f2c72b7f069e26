"""One seed, one run: a batcher given one seed collects the same trajectories in process and over 1, 2 or 4 worker
processes (and, in test_ray_batcher.py, over Ray actors), since env ``i``'s episodes and the agent's draws for it
depend on ``(seed, i, step)`` only."""

from __future__ import annotations

import pytest
import torch

from rlstruct import DictTensor, RL_Batcher
from rlstruct.algos import create_env, describe_env
from rlstruct.algos.networks import build_actor_critic
from rlstruct.algos.policies import create_policy_agent, create_recurrent_agent
from rlstruct.errors import ConfigError
from tests.fakes import ConstantAgent, CountingEnv
from tests.helpers import assert_same

pytestmark = pytest.mark.timeout(180)

N_ENVS = 4
STOCHASTIC = DictTensor({"stochastic": torch.tensor([True])})


def policy_args(backend: str) -> tuple[dict, dict]:
    """``(agent_args, weights)``: a small policy of CartPole's actor-critic, and weights to send it."""
    spec = describe_env("CartPole-v1", backend, None)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        weights = build_actor_critic(spec, (8,)).state_dict()
    return {"spec": spec, "hidden_sizes": (8,)}, weights


def collect(n_processes: int, backend: str, n_executes: int = 2, **kw) -> list:
    agent_args, weights = policy_args(backend)
    env_args = {"name": "CartPole-v1", "n_envs": N_ENVS // max(n_processes, 1), "autoreset": True,
                "backend": backend}
    out = []
    with RL_Batcher(12, create_policy_agent, agent_args, create_env, env_args, n_processes, 7, agent_seeds=11,
                    agent_info=STOCHASTIC, **kw) as b:
        b.update(weights)
        b.reset()
        for _ in range(n_executes):
            b.execute()
            out.append(b.get()[0])
    return out


@pytest.mark.parametrize("backend", ["torch", "gymnasium"])
def test_one_seed_gives_the_same_trajectories_in_process_and_over_workers(backend):
    alone = collect(0, backend)
    # Episodes end within 24 steps of a random CartPole policy: auto-resets and sampled actions both take part.
    assert bool(alone[1].trajectories["_observation/done"].any())
    for n_processes in (4,) if backend == "torch" else (2,):  # one and two: test_batchers.py, tests/algos
        for a, b in zip(alone, collect(n_processes, backend)):
            assert_same(a, b)


def test_the_recurrent_agent_collects_the_same_trajectories_in_process_and_over_workers():
    """The LSTM agent's draws are keyed by global env index too; its memory, carried from one acquisition to the next
    and stored at each one's start, is the same bits whatever process steps the env."""
    spec = describe_env("CartPoleNoVel-v1", "torch", None)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        weights = create_recurrent_agent(spec, (8,)).model.state_dict()
    runs = []
    for n_processes in (0, 2):
        env_args = {"name": "CartPoleNoVel-v1", "n_envs": N_ENVS // max(n_processes, 1), "autoreset": True}
        with RL_Batcher(12, create_recurrent_agent, {"spec": spec, "hidden_sizes": (8,)}, create_env, env_args,
                        n_processes, 7, agent_seeds=11, agent_info=STOCHASTIC) as b:
            b.update(weights)
            b.reset()
            runs.append([])
            for _ in range(2):
                b.execute()
                runs[-1].append(b.get()[0])
    alone, workers = runs
    assert bool(alone[1].trajectories["observation/initial_state"][:, 1:].any())  # episodes restart the memory
    assert bool(alone[1].info["agent_state/h"].abs().sum() > 0)
    for a, b in zip(alone, workers):
        assert_same(a, b)


def test_another_seed_gives_other_actions():
    agent_args, weights = policy_args("torch")
    env_args = {"name": "CartPole-v1", "n_envs": N_ENVS, "autoreset": True}
    actions = []
    for agent_seed in (11, 12):
        with RL_Batcher(12, create_policy_agent, agent_args, create_env, env_args, 0, 7, agent_seeds=agent_seed,
                        agent_info=STOCHASTIC) as b:
            b.update(weights)
            b.reset()
            b.execute()
            actions.append(b.get()[0].trajectories["action/action"])
    assert not torch.equal(*actions)


def test_env_index_shifts_the_envs_a_batcher_steps():
    """A batcher of the last two envs (env_index=2) collects rows 2 and 3 of the batcher of all four."""
    whole = collect(0, "torch", n_executes=1)[0]
    agent_args, weights = policy_args("torch")
    env_args = {"name": "CartPole-v1", "n_envs": 2, "autoreset": True}
    with RL_Batcher(12, create_policy_agent, agent_args, create_env, env_args, 0, 7, agent_seeds=11,
                    agent_info=STOCHASTIC, env_index=2) as b:
        b.update(weights)
        b.reset()
        b.execute()
        part = b.get()[0]
    assert_same(whole.index(torch.tensor([2, 3])), part)


def test_one_seed_needs_n_envs_in_env_args_and_one_agent_seed():
    with pytest.raises(ConfigError, match=r"with one seed \(seeds=7\) env_args must hold 'n_envs'"):
        RL_Batcher(4, ConstantAgent, {}, CountingEnv, {"episode_lengths": (3,)}, 0, 7)
    with pytest.raises(TypeError, match=r"agent_seeds must be one int \(or None\) when seeds is one int, got list"):
        RL_Batcher(4, ConstantAgent, {}, CountingEnv, {"n_envs": 2}, 0, 7, agent_seeds=[1])
    with pytest.raises(ValueError, match=r"env_index must be an int >= 0"):
        RL_Batcher(4, ConstantAgent, {}, CountingEnv, {"n_envs": 2}, 0, 7, env_index=-1)
