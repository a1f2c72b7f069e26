"""Faults that change nothing: with one seed and envs that hand out their state, a worker SIGKILLed in the middle of
an acquisition is replaced by one with the same seeds and the state kept at the acquisition's start, and every
acquisition's trajectories are those of a batcher nobody killed. Where the state cannot be kept, the replacement
starts new episodes, as its record says."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from rlstruct import DictTensor, RL_Batcher
from rlstruct.algos import create_env, describe_env
from rlstruct.algos.networks import build_actor_critic, recurrent_actor_critic
from rlstruct.algos.policies import create_policy_agent, create_recurrent_agent
from tests.fakes import SlowWrapper
from tests.helpers import assert_same, torch_threads

pytestmark = pytest.mark.timeout(240)

T = 12
N_ENVS = 4
STOCHASTIC = DictTensor({"stochastic": torch.tensor([True])})


def _collect(env: str, backend: str, recurrent: bool, n_processes: int, kill: bool, n_executes: int = 3):
    """``n_executes`` acquisitions of a small policy sampling on ``env``, one seed, ``restart_workers=1``; with
    ``kill``, worker 1 is SIGKILLed while the second acquisition runs. Returns the trajectories and the restarts."""
    spec = describe_env(env, backend, None)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        weights = (recurrent_actor_critic if recurrent else build_actor_critic)(spec, (8,)).state_dict()
    create = create_recurrent_agent if recurrent else create_policy_agent
    agent_args = {"create": create, "args": {"spec": spec, "hidden_sizes": (8,)}, "delay": 0.05 if kill else 0.0}
    env_args = {"name": env, "n_envs": N_ENVS // max(n_processes, 1), "autoreset": True, "backend": backend}
    out = []
    # in process, the workers' one torch thread: the same rows are the same bits only at the same thread count
    with torch_threads(1), RL_Batcher(T, SlowWrapper, agent_args, create_env, env_args, n_processes, 7,
                                      agent_seeds=11, agent_info=STOCHASTIC, restart_workers=1) as b:
        b.update(weights)
        b.reset()
        for i in range(n_executes):
            b.execute()
            if kill and i == 1:
                time.sleep(0.2)  # steps of 0.05 s: the kill lands before the acquisition's end
                os.kill(b.worker_reports()[1]["pid"], signal.SIGKILL)
            out.append(b.get()[0])
        return out, b.restarts


@pytest.mark.parametrize(("env", "recurrent"), [("CartPole-v1", False), ("MinAtar/Breakout-v1", False),
                                                ("CartPoleNoVel-v1", True)])
@pytest.mark.slow
def test_a_worker_killed_mid_acquisition_changes_nothing(env, recurrent):
    # The recurrent agent's draws depend on the split (its generator is seeded per worker): its reference is an
    # unbroken run over as many workers; the others' is the same run in process.
    alone, _ = _collect(env, "torch", recurrent, 2 if recurrent else 0, kill=False)
    killed, restarts = _collect(env, "torch", recurrent, 2, kill=True)
    assert [(r.worker_id, r.acquisition, r.during, r.exact) for r in restarts] == [(1, 2, "get", True)]
    assert (restarts[0].seed, restarts[0].agent_seed) == (7, 11) and "SIGKILL" in restarts[0].cause
    for a, b in zip(alone, killed):
        assert_same(a, b)


@pytest.mark.parametrize(("autoreset", "fault", "during"), [(False, "raise_at_call", "get"),
                                                        (True, "raise_at_update", "update")])
def test_a_worker_in_process_is_replaced_exactly(autoreset, fault, during):
    """In process, the agent raises once: in the second acquisition of episodic envs (the running set shrinks as
    episodes end), or in the update after the first acquisition. The replacement collects what the unbroken batcher
    collects."""
    spec = describe_env("CartPole-v1", "torch", None)
    weights = build_actor_critic(spec, (8,)).state_dict()
    env_args = {"name": "CartPole-v1", "n_envs": N_ENVS, "autoreset": autoreset}
    runs = []
    for at in (None, 1 + T + 5 if fault == "raise_at_call" else 2):
        SlowWrapper.raised = False
        agent_args = {"create": create_policy_agent, "args": {"spec": spec, "hidden_sizes": (8,)}, "delay": 0.0,
                      fault: at}
        with RL_Batcher(T, SlowWrapper, agent_args, create_env, env_args, 0, 7, agent_seeds=11,
                        agent_info=STOCHASTIC, restart_workers=1) as b:
            b.update(weights)
            b.reset()
            out, n = [], N_ENVS
            while n > 0 and len(out) < 4:
                b.execute()
                traj, n = b.get()
                out.append(traj)
                b.update(weights)
            runs.append((out, [(r.during, r.exact) for r in b.restarts]))
    (alone, none), (replaced, restarts) = runs
    assert none == [] and restarts == [(during, True)]
    assert len(alone) == len(replaced) >= 3
    if not autoreset:
        assert alone[-1].n_elems() < N_ENVS  # envs finished on the way
    for a, b in zip(alone, replaced):
        assert_same(a, b)


def test_envs_without_state_restart_with_new_seeds():
    """gymnasium's CartPole has no ``get_state``: the replacement starts new episodes, and says so."""
    killed, restarts = _collect("CartPole-v1", "gymnasium", False, 2, kill=True, n_executes=2)
    (r,) = restarts
    assert (r.worker_id, r.acquisition, r.exact) == (1, 2, False) and r.seed != 7
    # Worker 1's rows of the failed acquisition start with a reset: new episodes.
    assert bool(killed[1].trajectories["observation/initial_state"][N_ENVS // 2:, 0].all())
