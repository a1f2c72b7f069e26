"""RL_Batcher: equivalence across running modes, the contract, misuse and fault injection."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstruct import DictTensor, Trajectories
from rlstruct.batchers import RL_Batcher, WorkerPlacement
from rlstruct.batchers._buffer import copy_batch_major, empty_output
from rlstruct.envs import GymEnv, GymEnvInf, JaxVecEnv, TorchVecEnv, VecEnv, make_env
from rlstruct.errors import (
    BatcherStateError,
    BatcherWorkerError,
    BatchSizeError,
    ConfigError,
    DeviceMismatchError,
    SeedError,
)
from tests.conftest import device_params
from tests.fakes import (
    ConstantAgent,
    CounterAgent,
    CountingEnv,
    HistorySamplingAgent,
    MetaStateAgent,
    SamplingAgent,
    pid_alive,
)
from tests.helpers import AUTORESET, EPISODIC, assert_refused_while_pending, assert_same, get_when_ready, wall_limit

pytestmark = pytest.mark.timeout(120)


def collect(n_processes, seeds, env_args, n_timesteps=3, n_executes=4, agent_info=None, device="cpu", **kw):
    """Runs reset + several execute/get and returns the list of (Trajectories, n_still_running)."""
    out = []
    with RL_Batcher(n_timesteps, CounterAgent, {"device": device}, CountingEnv, {**env_args, "device": device},
                    n_processes, seeds, agent_info=agent_info, agent_seeds=[s + 100 for s in seeds],
                    device=device, **kw) as b:
        b.reset()
        for _ in range(n_executes):
            b.execute()
            traj, n = b.get()
            # zero_copy hands out views that later acquisitions overwrite: keep copies.
            out.append((traj.clone() if kw.get("zero_copy") else traj, n))
            if n == 0:
                break
    return out


@pytest.mark.parametrize("env_args", [EPISODIC, AUTORESET], ids=["episodic", "autoreset"])
def test_in_process_and_one_worker_are_identical(env_args):
    local = collect(0, [7], env_args)
    remote = collect(1, [7], env_args)
    assert len(local) == len(remote)
    for (ta, na), (tb, nb) in zip(local, remote):
        assert na == nb
        assert_same(ta, tb)


def test_two_workers_equal_one_worker_each():
    both = collect(2, [3, 11], AUTORESET, n_executes=3)
    for k, seed in enumerate([3, 11]):
        alone = collect(0, [seed], AUTORESET, n_executes=3)
        for (tb, nb), (ta, na) in zip(both, alone):
            assert nb == 6 and na == 3
            assert_same(tb.index(torch.arange(3 * k, 3 * k + 3)), ta)


def test_two_workers_equal_one_worker_each_episodic():
    """Episodic envs leave rows out as they finish: each worker's running rows, in order, in every get."""
    both = collect(2, [3, 11], EPISODIC, n_executes=5)
    alone = [collect(0, [seed], EPISODIC, n_executes=5) for seed in (3, 11)]
    assert len(both) == len(alone[0]) == len(alone[1]) == 3
    for i, (tb, nb) in enumerate(both):
        (t0, n0), (t1, n1) = alone[0][i], alone[1][i]
        assert nb == n0 + n1 and tb.n_elems() == t0.n_elems() + t1.n_elems()
        assert_same(tb.index(torch.arange(t0.n_elems())), t0)
        assert_same(tb.index(torch.arange(t0.n_elems(), tb.n_elems())), t1)


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().reshape(-1).view(torch.uint8)


@settings(max_examples=200, deadline=None)
@given(
    t=st.integers(0, 6),
    b=st.integers(0, 6),
    row=st.sampled_from([(), (1,), (2,), (3,), (4,), (5,), (2, 3), (3, 8)]),
    dtype=st.sampled_from([torch.bool, torch.uint8, torch.int16, torch.float16, torch.float32, torch.int64,
                           torch.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_copy_batch_major_moves_every_bit(t, b, row, dtype, seed):
    """Rows move as machine words (NaN payloads, negative zeros and all): the same bits as an element-wise copy."""
    gen = torch.Generator().manual_seed(seed)
    nbytes = t * b * math.prod(row) * torch.empty((), dtype=dtype).element_size()
    bits = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    src = bits.view(dtype).view((t, b) + row) if dtype != torch.bool else (bits % 2).bool().view((t, b) + row)
    dst = torch.empty((b, t) + row, dtype=dtype)
    copy_batch_major(dst, src)
    assert torch.equal(as_bytes(dst), as_bytes(src.transpose(0, 1)))
    # A slice of a larger output (the rows of one worker) is written in place, its neighbours untouched.
    out = torch.zeros((b + 2, t) + row, dtype=dtype)
    copy_batch_major(out[1 : b + 1], src)
    assert torch.equal(as_bytes(out[1 : b + 1]), as_bytes(dst))
    assert not as_bytes(out[0]).any() and not as_bytes(out[b + 1]).any()


def test_episodic_trace_matches_rlstructures_semantics():
    runs = collect(0, [0], EPISODIC, n_timesteps=3, n_executes=5)
    assert [r[0].trajectories.lengths.tolist() for r in runs] == [[2, 3, 3], [1, 3], [1]]
    assert [r[1] for r in runs] == [2, 1, 0]
    # agent_state/* is the state when each acquisition started: carried across executes.
    assert [r[0].info["agent_state/count"].tolist() for r in runs] == [[0, 0, 0], [3, 3], [6]]
    first = runs[0][0].trajectories
    # _observation is t+1 before any reset: the terminal step of env 0 is at t=1.
    assert first["_observation/done"][0, :2].tolist() == [False, True]
    assert first["observation/frame"][2, :, 1].tolist() == [0, 1, 2]
    assert first["_observation/frame"][2, :, 1].tolist() == [1, 2, 3]


def test_autoreset_rows_are_full_and_episodes_continue():
    runs = collect(0, [0], AUTORESET, n_timesteps=3, n_executes=3)
    for traj, n in runs:
        assert n == 3 and traj.trajectories.full()
    t0 = runs[0][0].trajectories
    # env 0 (episodes of 2): terminal at t=1, fresh observation at t=2 with initial_state.
    assert t0["_observation/done"][0].tolist() == [False, True, False]
    assert t0["observation/initial_state"][0].tolist() == [True, False, True]
    assert not t0["observation/done"].any()


# In process and in worker processes: two workers cover what one does (each worker's rows of the shared buffer) and
# the gather of several, so the one-worker case is left out.
@pytest.mark.parametrize("n_processes,seeds", [(0, [7]), (2, [7, 9])])
@pytest.mark.parametrize("env_args", [EPISODIC, AUTORESET], ids=["episodic", "autoreset"])
def test_zero_copy_gives_what_copies_give(n_processes, seeds, env_args):
    """Views of the buffer (every env running) or copies (episodic envs finished before an acquisition): the
    same trajectories as the default copies, in every running mode."""
    copied = collect(n_processes, seeds, env_args, n_executes=5)
    viewed = collect(n_processes, seeds, env_args, n_executes=5, zero_copy=True)
    assert len(copied) == len(viewed) >= 3
    for (ta, na), (tb, nb) in zip(copied, viewed):
        assert na == nb
        assert_same(ta, tb)


def gym_cartpoles(n_envs: int, seed: int) -> GymEnvInf:
    """Auto-reset gymnasium CartPoles over a list: an env that writes its observations into the buffer."""
    return GymEnvInf([gym.make("CartPole-v1", max_episode_steps=9) for _ in range(n_envs)], seed)


def torch_cartpoles(n_envs: int, seed: int) -> VecEnv:
    """Auto-reset torch CartPoles on the CPU: with numba, the compiled kernel writes into the buffer."""
    return make_env("CartPole-v1", n_envs, seed=seed, autoreset=True, backend="torch", max_episode_steps=9)


def gymnax_cartpoles(n_envs: int, seed: int) -> VecEnv:
    """Auto-reset gymnax CartPoles on the CPU: step_into copies the jitted step's outputs into the buffer."""
    return make_env("CartPole-v1", n_envs, seed=seed, autoreset=True, backend="gymnax", max_episode_steps=9)


def collect_gym(n_processes, seeds, agent=SamplingAgent, create_env=gym_cartpoles, **kw):
    out = []
    with RL_Batcher(6, agent, {}, create_env, {"n_envs": 3}, n_processes, seeds,
                    agent_seeds=[s + 100 for s in seeds], **kw) as b:
        b.reset()
        for _ in range(4):
            b.execute()
            out.append(b.get()[0].clone())
    return out


@pytest.mark.slow  # 3.9 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.parametrize("create_env,cls", [(gym_cartpoles, GymEnv), (torch_cartpoles, TorchVecEnv)],
                         ids=["gymnasium-list", "torch"])
@pytest.mark.parametrize("agent", [SamplingAgent, HistorySamplingAgent], ids=["recurrent", "history"])
@pytest.mark.parametrize("zero_copy", [False, True])
def test_an_env_writing_in_place_gives_what_step_gives(monkeypatch, agent, zero_copy, create_env, cls):
    """GymEnvInf over a list, and the torch CartPole's compiled kernel, write each step into the buffer
    (step_into); the same trajectories as the generic loop over step(), in process, in two worker processes (each
    writing its rows of the shared buffer), and with zero_copy.

    The worker processes run with zero_copy only: each one compiles the torch CartPole's kernel again (the test's
    cost), and copies or views of the same buffer rows are test_zero_copy_gives_what_copies_give's claim."""
    monkeypatch.setenv("RLSTRUCT_JIT_AFTER", "0")  # the compiled kernel from the first step (workers inherit it)
    if cls is TorchVecEnv and not create_env(1, 0).writes_in_place():
        pytest.skip("numba is not installed: the torch CartPole does not write in place")
    check_in_place_gives_what_step_gives(monkeypatch, agent, zero_copy, create_env, cls,
                                         n_workers=2 if zero_copy else 0)


@pytest.mark.slow
def test_a_jax_env_writing_in_place_gives_what_step_gives(monkeypatch):
    """The JAX envs on the CPU copy the jitted step's outputs into the buffer (step_into): as above, once, with one
    worker process (each worker imports JAX and compiles the step, the test's cost; the rows of a second worker are
    the claim of the test above)."""
    pytest.importorskip("gymnax", reason="the jax extra is not installed: pip install 'rlstruct[jax]'")
    check_in_place_gives_what_step_gives(monkeypatch, SamplingAgent, True, gymnax_cartpoles, JaxVecEnv, n_workers=1)


def check_in_place_gives_what_step_gives(monkeypatch, agent, zero_copy, create_env, cls, *, n_workers: int):
    """In process, and in ``n_workers`` worker processes (seeds 5 and 8; none if 0), ``create_env`` writing in place
    gives what its generic ``step`` does."""
    assert create_env(1, 0).writes_in_place()
    seeds = [5, 8][:n_workers]
    in_place = collect_gym(0, [5], agent, create_env, zero_copy=zero_copy)
    workers = collect_gym(n_workers, seeds, agent, create_env, zero_copy=zero_copy) if n_workers else []
    monkeypatch.setattr(cls, "writes_in_place", lambda self: False)
    generic = collect_gym(0, [5], agent, create_env)
    other = collect_gym(0, [8], agent, create_env) if n_workers > 1 else []
    assert any(t.trajectories["_observation/done"].any() for t in generic)  # auto-resets happened
    for i, (a, b) in enumerate(zip(generic, in_place)):
        assert_same(a, b)
        if workers:
            assert_same(workers[i].index(torch.arange(3)), a)
        if other:
            assert_same(workers[i].index(torch.arange(3, 6)), other[i])


@settings(max_examples=25, deadline=None)
@given(
    n_envs=st.integers(1, 5),
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    n_timesteps=st.integers(1, 6),
    autoreset=st.booleans(),
)
def test_zero_copy_in_process_matches_copies_for_any_episode_layout(n_envs, lengths, n_timesteps, autoreset):
    """Episodes of any lengths, acquisitions of any size: views (every env running) and copies (rows already
    finished) alternate as the episodes end, and the trajectories are those of the default copies."""
    env_args = {"n_envs": n_envs, "episode_lengths": tuple(lengths), "autoreset": autoreset}
    copied = collect(0, [3], env_args, n_timesteps=n_timesteps, n_executes=6)
    viewed = collect(0, [3], env_args, n_timesteps=n_timesteps, n_executes=6, zero_copy=True)
    assert len(copied) == len(viewed)
    for (ta, na), (tb, nb) in zip(copied, viewed):
        assert na == nb
        assert_same(ta, tb)


def _storage(traj: Trajectories, key: str = "observation/frame") -> int:
    return traj.trajectories[key].untyped_storage().data_ptr()


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("n_processes", [0, 2])
def test_zero_copy_views_live_until_the_second_execute_after_their_get(n_processes, device):
    if n_processes and device != "cpu":
        pytest.skip("GPU worker processes always copy")
    seeds = [3, 5][: max(n_processes, 1)]
    with RL_Batcher(4, CounterAgent, {"device": device}, CountingEnv, {**AUTORESET, "device": device}, n_processes,
                    seeds, device=device, zero_copy=True) as b:
        b.reset()
        b.execute()
        first, _ = b.get()
        kept = first.clone()
        frame = first.trajectories["observation/frame"]
        assert frame.shape[:2] == (b.n_elems(), 4) and not frame.is_contiguous()  # [B, T] over [T, B] storage
        b.execute()  # the learner reads `first` while the next acquisition runs: it writes the other buffer
        second, _ = b.get()
        assert_same(first, kept)
        assert _storage(second) != _storage(first)
        assert not torch.equal(second.trajectories["observation/frame"], frame)  # the counters moved on
        b.execute()
        third, _ = b.get()
        assert _storage(third) == _storage(first)  # the first buffer again: `first` now shows the third acquisition
        assert torch.equal(first.trajectories["observation/frame"], third.trajectories["observation/frame"])


@pytest.mark.parametrize("n_processes", [0, 2])
def test_copies_are_fresh_contiguous_tensors(n_processes):
    seeds = [3, 5][: max(n_processes, 1)]
    with RL_Batcher(4, CounterAgent, {}, CountingEnv, AUTORESET, n_processes, seeds) as b:
        b.reset()
        b.execute()
        first, _ = b.get()
        kept = first.clone()
        for _ in range(2):
            b.execute()
            later, _ = b.get()
            assert _storage(later) != _storage(first)
        assert_same(first, kept)
        assert all(v.is_contiguous() for v in first.trajectories.values())


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("n_processes", [0, 1, 2])
def test_contract(n_processes, device):
    n_workers = max(n_processes, 1)
    n = 3 * n_workers
    ai = DictTensor({"bonus": torch.arange(n, dtype=torch.float32)})
    ei = DictTensor({"level": torch.arange(n)})
    seeds = list(range(n_workers))
    with RL_Batcher(4, CounterAgent, {"device": device}, CountingEnv, {**EPISODIC, "device": device}, n_processes,
                    seeds, agent_info=ai.slice(0, 1), env_info=ei.slice(0, 1), device=device) as b:
        assert b.n_elems() == n
        b.reset(agent_info=ai, env_info=ei)
        b.execute()
        traj, running = b.get()
        assert traj.device() == torch.device(device)
        assert traj.n_elems() == n and running == n_workers  # episodes of 2 and 4 steps ended
        assert set(traj.info.keys()) == {"agent_info/bonus", "env_info/level", "agent_state/count"}
        keys = set(traj.trajectories.keys())
        for prefix in ("observation/", "_observation/"):
            assert {prefix + k for k in ("frame", "reward", "done", "terminated", "truncated", "initial_state",
                                         "last_action")} <= keys
        assert {"action/action", "action/count", "action/scaled", "action/bonus"} <= keys
        assert traj.info["env_info/level"].tolist() == list(range(n))
        assert traj.trajectories["action/bonus"][:, 0].tolist() == list(range(n))
        # A new agent_info from execute() persists; rows of finished envs are ignored.
        b.update({"scale": torch.tensor([2.0])})
        b.execute(agent_info=DictTensor({"bonus": -torch.ones(n)}))
        traj2, _ = b.get()
        assert (traj2.trajectories["action/bonus"][:, 0] == -1).all()
        m = traj2.trajectories.mask().bool()
        assert torch.equal(traj2.trajectories["action/scaled"][m], 2 * traj2.trajectories["action/count"][m].float())
        t = b.timings()
        assert t["env_steps"] == (2 + 4 + 4 + 3) * n_workers and t["steps"] > 0
        assert all(t[p] >= 0 for p in ("agent_forward", "env_step", "buffer_write", "copy", "wait", "gather"))
        b.reset_timings()
        assert b.timings()["env_steps"] == 0


def test_get_non_blocking_and_async_overlap():
    with RL_Batcher(50, ConstantAgent, {}, CountingEnv, {"n_envs": 4, "episode_lengths": (10**6,), "autoreset": True},
                    1, [0]) as b:
        b.reset()
        b.execute()
        traj, n = get_when_ready(b)
        assert traj.trajectories.full() and n == 4


@pytest.mark.parametrize("zero_copy", [False, True])
def test_history_is_the_current_acquisition_so_far(zero_copy):
    with RL_Batcher(4, HistoryAgent, {}, CountingEnv, AUTORESET, 0, [0], zero_copy=zero_copy) as b:
        b.reset()
        for _ in range(3):  # with zero_copy, each buffer in turn
            b.execute()
            traj, _ = b.get()
            assert traj.trajectories["action/history_length"][0].tolist() == [0, 1, 2, 3]
            # the history the agent saw at the last step is what the trajectories hold for the steps before it
            assert torch.equal(traj.trajectories["action/history_frame_sum"][:, 3],
                               traj.trajectories["observation/frame"][:, :3].sum((1, 2)).to(torch.float32))


class HistoryAgent(ConstantAgent):
    def require_history(self):
        return True

    def __call__(self, state, observation, agent_info, history=None):
        action, state = super().__call__(state, observation, agent_info)
        action.set("history_length", history.lengths.clone())
        action.set("history_frame_sum", history["observation/frame"].sum((1, 2)).to(torch.float32))
        assert history.temporal_size() == int(history.lengths[0])
        return action, state


# --------------------------------------------------------------------------- misuse
def test_misuse_raises_batcher_state_error():
    b = RL_Batcher(3, CounterAgent, {}, CountingEnv, EPISODIC, 0, [0], agent_info=DictTensor({"bonus": torch.zeros(1)}))
    with pytest.raises(BatcherStateError, match="before reset"):
        b.execute()
    with pytest.raises(BatcherStateError, match="no execute\\(\\) pending"):
        b.get()
    b.reset()
    b.execute()
    assert_refused_while_pending(b)
    b.get()
    with pytest.raises(DeviceMismatchError, match="agent_info must be on the CPU"):
        b.reset(agent_info=DictTensor({"bonus": torch.zeros(3, device="meta")}))
    with pytest.raises(BatchSizeError, match="one row per env"):
        b.reset(agent_info=DictTensor({"bonus": torch.zeros(2)}))
    with pytest.raises(ValueError, match="keys, row shapes and dtypes"):
        b.execute(agent_info=DictTensor({"other": torch.zeros(3)}))
    with pytest.raises(DeviceMismatchError, match="CPU state dict"):
        b.update({"scale": torch.zeros(1, device="meta")})
    while True:
        b.execute()
        _, n = b.get()
        if n == 0:
            break
    with pytest.raises(BatcherStateError, match="every env has finished"):
        b.execute()
    b.close()
    b.close()  # idempotent
    with pytest.raises(BatcherStateError, match="after close"):
        b.reset()


def test_bad_constructor_arguments():
    # A wrong number of seeds is a bad argument (ConfigError, a ValueError), not a call-order error.
    with pytest.raises(ConfigError, match="one seed per worker"):
        RL_Batcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 2, [0])
    with pytest.raises(ConfigError, match="one seed per worker"):
        RL_Batcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0, 1])
    with pytest.raises(DeviceMismatchError, match="env_info must be on the CPU"):
        RL_Batcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0],
                   env_info=DictTensor({"x": torch.zeros(1, device="meta")}))
    with pytest.raises(ValueError, match="n_timesteps"):
        RL_Batcher(0, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0])
    with pytest.raises(TypeError, match="picklable"):
        RL_Batcher(3, lambda: ConstantAgent(), {}, CountingEnv, EPISODIC, 1, [0])


@pytest.mark.parametrize("cls", ["RL_Batcher", "RayBatcher"])
def test_bad_seeds_are_refused_before_anything_starts(cls):
    from rlstruct.batchers import RayBatcher

    batcher = {"RL_Batcher": RL_Batcher, "RayBatcher": RayBatcher}[cls]
    with pytest.raises(SeedError, match=r"seeds\[1\] must be an int in \[0, 2\*\*31\), got -1"):
        batcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 2, [0, -1])
    with pytest.raises(SeedError, match=r"agent_seeds\[0\] must be an int in \[0, 2\*\*31\), got str '0'"):
        batcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0], agent_seeds=["0"])


def test_env_on_the_wrong_device_is_named():
    with pytest.raises(BatcherWorkerError, match="DeviceEnv"):
        RL_Batcher(3, ConstantAgent, {}, CountingEnv, {**EPISODIC, "device": "meta"}, 0, [0])


def test_check_device_env_variable_wraps_agents(monkeypatch):
    monkeypatch.setenv("RLSTRUCT_CHECK_DEVICE", "1")
    with pytest.raises(BatcherWorkerError, match="initial_state: the returned state must be on cpu, got meta"):
        RL_Batcher(3, MetaStateAgent, {}, CountingEnv, EPISODIC, 0, [0])


# --------------------------------------------------------------------------- faults
def _children_of_batcher(b):
    return [r["pid"] for r in b.worker_reports()]


def _second_get_raises(b: RL_Batcher, match: str) -> BatcherWorkerError:
    """Resets ``b``, collects once, and returns the error its second ``get`` raises (matching ``match``)."""
    b.reset()
    b.execute()
    b.get()
    b.execute()
    with pytest.raises(BatcherWorkerError, match=match) as e:
        b.get()
    return e.value


@pytest.mark.parametrize("zero_copy", [False, True])
@pytest.mark.parametrize("n_processes", [0, 2])
def test_env_raising_in_one_worker(n_processes, zero_copy):
    n_workers = max(n_processes, 1)
    b = RL_Batcher(3, ConstantAgent, {}, CountingEnv, {**AUTORESET, "fail_at_step": 5, "fail_seed": n_workers - 1},
                   n_processes, list(range(n_workers)), zero_copy=zero_copy)
    pids = _children_of_batcher(b) if n_processes else []
    error = _second_get_raises(b, f"worker {n_workers - 1} .*raised RuntimeError: CountingEnv failure")
    assert error.worker_id == n_workers - 1
    assert "CountingEnv failure injected" in error.remote_traceback
    with pytest.raises(BatcherStateError, match="after a worker failed"):
        b.execute()
    b.close()
    assert not any(pid_alive(p) for p in pids)


class _FailingStep(gym.Wrapper):
    def __init__(self, env, fail_at: int):
        super().__init__(env)
        self.fail_at, self.steps = fail_at, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError(f"gymnasium env failure injected at step {self.steps}")
        return self.env.step(action)


def failing_gym_cartpoles(n_envs: int, seed: int) -> GymEnvInf:
    """gym_cartpoles whose last env raises at its 5th step: inside step_into, which writes in place."""
    envs = [gym.make("CartPole-v1") for _ in range(n_envs)]
    envs[-1] = _FailingStep(envs[-1], fail_at=5)
    return GymEnvInf(envs, seed)


@pytest.mark.parametrize("n_processes", [0, 1])
def test_an_env_raising_while_writing_in_place_is_reported(n_processes):
    b = RL_Batcher(3, ConstantAgent, {}, failing_gym_cartpoles, {"n_envs": 2}, n_processes, [0])
    pids = _children_of_batcher(b) if n_processes else []
    _second_get_raises(b, "worker 0 .*raised RuntimeError: gymnasium env failure injected at step 5")
    b.close()
    assert not any(pid_alive(p) for p in pids)


def test_agent_raising_is_reported_at_get():
    with RL_Batcher(3, CounterAgent, {"fail_at_call": 2}, CountingEnv, AUTORESET, 1, [0]) as b:
        b.reset()
        b.execute()
        with pytest.raises(BatcherWorkerError, match="worker 0 raised ValueError: CounterAgent failure"):
            b.get()


def test_killed_worker_is_detected_quickly():
    b = RL_Batcher(3, ConstantAgent, {}, CountingEnv, {**AUTORESET, "hang_at_step": 4}, 2, [0, 1], timeout=60)
    pids = _children_of_batcher(b)
    b.reset()
    b.execute()
    b.get()
    b.execute()  # both workers hang at step 4
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(BatcherWorkerError, match="worker 1 .* was killed by SIGKILL without answering"):
        b.get()
    assert time.monotonic() - t0 < wall_limit(10)
    b.close()
    assert not any(pid_alive(p) for p in pids)


@pytest.mark.slow
def test_hung_worker_times_out():
    b = RL_Batcher(3, ConstantAgent, {}, CountingEnv, {**AUTORESET, "hang_at_step": 1}, 1, [0], timeout=2)
    pids = _children_of_batcher(b)
    b.reset()
    b.execute()
    with pytest.raises(BatcherWorkerError, match="did not answer within 2 s"):
        b.get()
    b.close()
    assert not any(pid_alive(p) for p in pids)


def test_error_at_construction_leaves_no_process():
    before = set(p.pid for p in __import__("multiprocessing").active_children())
    with pytest.raises(BatcherWorkerError, match="worker 0 raised TypeError"):
        RL_Batcher(3, ConstantAgent, {}, CountingEnv, {"no_such_argument": 1}, 1, [0])
    after = set(p.pid for p in __import__("multiprocessing").active_children())
    assert after <= before


def exit_while_building(**kwargs):
    os._exit(3)  # what a child that fails to import its main script does, before it can report


def test_a_worker_exiting_before_it_reports_is_named_with_its_exit_code(monkeypatch):
    # As from a script run as a file, whose workers run it again (an xdist worker's __main__ is a `python -c`).
    monkeypatch.setattr("rlstruct.batchers._parent.main_file", lambda: "train.py")
    exited = r"worker 0 \(pid \d+\) exited with code 3 .*if __name__ == '__main__'"
    with pytest.raises(BatcherWorkerError, match=exited):
        RL_Batcher(3, ConstantAgent, {}, exit_while_building, {}, 1, [0])


@pytest.mark.slow  # a spawned worker importing torch: 3-4 CPU s
def test_worker_placements_reach_the_child_environment():
    """Each worker gets its own placement: the first (no variables of its own: forked from the fork server) one
    thread and none of the second's variables, the second (spawned, as a placement with variables of its own is:
    the fork server's environment is not the worker's) its variable and two threads; both a CPU placement's hidden
    GPUs; the parent's environment is unchanged."""
    placements = [WorkerPlacement("cpu"), WorkerPlacement("cpu", env={"RLSTRUCT_TEST_TAG": "b"}, num_threads=2)]
    with RL_Batcher(2, ConstantAgent, {}, CountingEnv, AUTORESET, 2, [0, 1], worker_placements=placements) as b:
        assert [w.start_method for w in b._workers] == ["forkserver", "spawn"]
        reports = b.worker_reports()
        assert [r["environ"].get("RLSTRUCT_TEST_TAG") for r in reports] == [None, "b"]
        assert [r["num_threads"] for r in reports] == [1, 2]
        for r in reports:
            assert r["environ"]["CUDA_VISIBLE_DEVICES"] == ""
            assert r["cuda_initialized"] is False
        assert "RLSTRUCT_TEST_TAG" not in os.environ


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="core pinning is Linux-only")
def test_a_worker_placement_pins_the_child_to_its_cores():
    core = max(os.sched_getaffinity(0))
    placements = [WorkerPlacement("cpu", cpus=(core,)), WorkerPlacement("cpu")]
    with RL_Batcher(2, ConstantAgent, {}, CountingEnv, AUTORESET, 2, [0, 1], worker_placements=placements) as b:
        pinned, free = b.worker_reports()
        assert pinned["cpus"] == [core]
        assert free["cpus"] == sorted(os.sched_getaffinity(0))


def test_worker_placement_validation():
    if hasattr(os, "sched_setaffinity"):
        with pytest.raises(ValueError, match=r"cpus must be a non-empty set of the cores .*\[100000\] are not"):
            WorkerPlacement("cpu", cpus=(100000,))
        with pytest.raises(ValueError, match="cpus must be a non-empty set"):
            WorkerPlacement("cpu", cpus=())
        with pytest.raises(ValueError, match="cpus must be a sequence of core numbers"):
            WorkerPlacement("cpu", cpus="x")
    with pytest.raises(ValueError, match="mps_active_thread_percentage"):
        WorkerPlacement("cuda:0", mps_active_thread_percentage=0)
    with pytest.raises(ValueError, match="visible_devices"):
        WorkerPlacement("cpu", visible_devices="0")
    with pytest.raises(ValueError, match="one WorkerPlacement per worker"):
        RL_Batcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 2, [0, 1], worker_placements=[WorkerPlacement()])


@pytest.mark.parametrize("n_processes", [0, 1])
def test_update_sends_a_copy_not_the_learners_tensor(n_processes):
    scale = torch.tensor([3.0])
    with RL_Batcher(2, CounterAgent, {}, CountingEnv, AUTORESET, n_processes, [0]) as b:
        b.reset()
        b.update({"scale": scale})
        scale.mul_(100)  # the learner keeps training in place: the agent must not see it
        b.execute()
        traj, _ = b.get()
    t = traj.trajectories
    assert torch.equal(t["action/scaled"], 3 * t["action/count"].float())


@pytest.mark.parametrize("shape", [(3, 5), (64, 128, 4, 64)], ids=["small", "large"])
def test_empty_output_is_a_plain_tensor_with_huge_page_advice_when_large(shape):
    x = empty_output(shape, torch.float32, torch.device("cpu"))
    assert x.shape == shape and x.dtype == torch.float32 and x.is_contiguous()
    x.fill_(1.5)
    assert float(x.sum()) == 1.5 * x.numel()
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if x.numel() * 4 < 8 << 20 or not (sys.platform.startswith("linux") and thp.exists()):
        return  # small tensors get no advice (their memory may still hold an earlier large one's)
    # The kernel marks a region advised with MADV_HUGEPAGE by "hg" in its VmFlags.
    assert "hg" in vm_flags(x.data_ptr() + x.numel() * 2)


def vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds ``address`` (from /proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(p, 16) for p in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")
