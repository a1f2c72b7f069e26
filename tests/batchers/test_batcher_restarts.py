"""RL_Batcher(..., restart_workers=N): a worker that raises, dies or hangs is replaced, its rows of the
acquisition under way are collected again by the new worker, and the caller never sees a step of the dead one.

Faults are injected with :class:`tests.fakes.FaultEnv` (worker ``k`` has env seed ``k``; the fault fires on the
worker of seed ``fault_seed`` only, so the restarted worker, which has another seed, runs on).
"""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest
import torch

from rlstruct.batchers import RL_Batcher, WorkerRestart, restart_seed
from rlstruct.errors import BatcherWorkerError
from tests.fakes import (
    ConstantAgent,
    CounterAgent,
    CountingEnv,
    FaultEnv,
    FirstSeedsOnlyEnv,
    RaiseOnceEnv,
    StartKillEnv,
    pid_alive,
)

T = 4
N_ENVS = 2
SCALE = 5.0


def _env(fault: str = "raise", at_step: int = 6, fault_seed: int | None = 1) -> dict:
    return {"n_envs": N_ENVS, "autoreset": True, "episode_lengths": (100,), "fault": fault, "at_step": at_step,
            "fault_seed": fault_seed}


def _batcher(env_args: dict, n_processes: int = 2, restarts: int = 1, **kwargs) -> RL_Batcher:
    n = max(n_processes, 1)
    b = RL_Batcher(T, CounterAgent, {}, FaultEnv, env_args, n_processes, list(range(n)),
                   agent_seeds=[10 + k for k in range(n)], restart_workers=restarts, **kwargs)
    b.reset()
    b.update({"scale": torch.tensor([SCALE])})
    return b


def _collect(b: RL_Batcher, n: int) -> list:
    out = []
    for _ in range(n):
        b.execute()
        traj, _ = b.get()
        out.append(traj)
    return out


def _check_worker_rows(traj, rows: slice, seed: int, t0: int) -> None:
    """Rows ``rows`` hold a full acquisition of the worker of env seed ``seed``, its episode at step ``t0`` when it
    started, and its agent holding the weights sent by ``update``."""
    tt = traj.trajectories
    frame = tt["observation/frame"][rows]
    ids = torch.arange(N_ENVS, dtype=torch.float32)
    assert torch.equal(frame[:, :, 0], (seed * 1000.0 + ids)[:, None].expand(-1, T)), frame[:, :, 0]
    assert torch.equal(frame[:, :, 1], (t0 + torch.arange(T, dtype=torch.float32)).expand(N_ENVS, -1))
    assert torch.equal(traj.trajectories.lengths[rows], torch.full((N_ENVS,), T))
    count = tt["action/count"][rows]
    assert torch.equal(count, (t0 + 1 + torch.arange(T)).expand(N_ENVS, -1))
    assert torch.equal(tt["action/scaled"][rows], count.float() * SCALE)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", ["raise", "exit", "segfault", "hang"])
@pytest.mark.slow
def test_a_failed_worker_is_replaced_and_its_rows_collected_again(fault, caplog):
    # A hang is found by the batcher's timeout: 1.5 s, where every healthy reply (an acquisition of 4 steps of a
    # counting env) takes milliseconds on a machine loaded 2x.
    b = _batcher(_env(fault), timeout=1.5 if fault == "hang" else 120.0)
    old_pid = b.worker_reports()[1]["pid"]
    with b, caplog.at_level(logging.WARNING, logger="rlstruct.batchers"):
        first, second, third = _collect(b, 3)  # worker 1 fails at its 6th step: in the second acquisition
        assert b.n_restarts == 1
        (r,) = b.restarts
        assert (r.worker_id, r.acquisition, r.during) == (1, 2, "get")
        assert r.seed == restart_seed(1, 1) and r.agent_seed == restart_seed(11, 1)
        assert {"raise": "RuntimeError", "exit": "exited with code 3", "segfault": "SIGSEGV",
                "hang": "did not answer"}[fault] in r.cause
        assert "worker 1 failed during get() of acquisition 2" in caplog.text
        # Worker 0 runs on; worker 1's rows of the failed acquisition are the new worker's, from fresh episodes,
        # with the last weights: no step of the dead worker.
        _check_worker_rows(first, slice(0, 2), 0, 0)
        _check_worker_rows(first, slice(2, 4), 1, 0)
        _check_worker_rows(second, slice(0, 2), 0, T)
        _check_worker_rows(second, slice(2, 4), r.seed, 0)
        _check_worker_rows(third, slice(0, 2), 0, 2 * T)
        _check_worker_rows(third, slice(2, 4), r.seed, T)
        new_pid = b.worker_reports()[1]["pid"]
        assert new_pid != old_pid and not pid_alive(old_pid)
    assert not pid_alive(new_pid)


@pytest.mark.timeout(240)
def test_restarts_are_deterministic():
    runs = []
    for _ in range(2):
        with _batcher(_env("exit")) as b:
            trajs = _collect(b, 3)
            # The cause names the dead worker's pid: everything else must match.
            runs.append((trajs, [(r.worker_id, r.acquisition, r.during, r.seed, r.agent_seed) for r in b.restarts]))
    (a, ra), (c, rc) = runs
    assert ra == rc and len(ra) == 1
    for x, y in zip(a, c):
        for k in x.trajectories.keys():
            assert torch.equal(x.trajectories[k], y.trajectories[k]), k


@pytest.mark.timeout(240)
def test_the_failure_after_the_last_restart_fails_the_batcher():
    # fault_seed=None: every worker, restarted ones included, fails at its 6th step; one restart is allowed.
    with _batcher(_env("raise", fault_seed=None), restarts=1) as b:
        b.execute()
        b.get()
        b.execute()
        with pytest.raises(BatcherWorkerError, match=r"restart_workers=1: every allowed restart has been used"):
            b.get()
        assert b.n_restarts == 1


@pytest.mark.timeout(240)
def test_a_replacement_that_fails_while_starting_uses_a_restart_too():
    # Worker 1 raises at its 6th step; its replacements cannot even be built: each try is one restart, and the
    # budget ends it instead of retrying forever.
    b = RL_Batcher(T, ConstantAgent, {}, FirstSeedsOnlyEnv, _env("raise"), 2, [0, 1], restart_workers=2)
    with b:
        b.reset()
        b.execute()
        b.get()
        b.execute()
        every = r"(?s)cannot be built with seed .*restart_workers=2: every allowed"
        with pytest.raises(BatcherWorkerError, match=every):
            b.get()
        assert [(r.worker_id, r.acquisition) for r in b.restarts] == [(1, 2), (1, 2)]
        assert "FaultEnv failure injected" in b.restarts[0].cause and "cannot be built" in b.restarts[1].cause
        assert b.restarts[0].seed != b.restarts[1].seed


@pytest.mark.timeout(120)
def test_without_restarts_the_first_failure_fails_the_batcher_as_before():
    with _batcher(_env("raise"), restarts=0) as b:
        b.execute()
        b.get()
        b.execute()
        with pytest.raises(BatcherWorkerError, match=r"worker 1 raised RuntimeError: FaultEnv failure injected"):
            b.get()
        assert b.n_restarts == 0 and b.restarts == []


@pytest.mark.timeout(120)
def test_an_in_process_worker_is_rebuilt():
    with _batcher(_env("raise", fault_seed=0), n_processes=0) as b:
        first, second = _collect(b, 2)
        assert [(r.worker_id, r.acquisition) for r in b.restarts] == [(0, 2)]
        _check_worker_rows(second, slice(0, 2), restart_seed(0, 1), 0)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("when", ["acquiring", "idle", "polled"])
@pytest.mark.slow
def test_a_worker_killed_from_outside_is_replaced(when):
    # Worker 0 (env seed 0) hangs at its first step: an acquisition under way until the kill, however late the kill
    # lands on a busy machine; its replacement (another seed) and worker 1 step on.
    env = {"n_envs": N_ENVS, "autoreset": True, "episode_lengths": (100,), "hang_at_step": 1, "fail_seed": 0}
    with RL_Batcher(T, ConstantAgent, {}, CountingEnv, env, 2, [0, 1], restart_workers=2) as b:
        b.reset()
        pid = b.worker_reports()[0]["pid"]
        if when == "idle":
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
            b.execute()
        else:
            b.execute()
            time.sleep(0.3)
            os.kill(pid, signal.SIGKILL)
        if when == "polled":  # a non-blocking get() finds the worker dead, and the wait that follows replaces it
            deadline = time.monotonic() + 60
            while (got := b.get(blocking=False))[0] is None and time.monotonic() < deadline:
                time.sleep(0.05)
            traj, n = got
        else:
            traj, n = b.get()
        assert [r.worker_id for r in b.restarts] == [0] and "SIGKILL" in b.restarts[0].cause
        assert "close the batcher" not in b.restarts[0].cause
        assert n == 4 and torch.equal(traj.trajectories.lengths, torch.full((4,), T))
        # Fresh episodes on the new worker's rows; worker 1's carry on from the reset.
        assert torch.equal(traj.trajectories["observation/frame"][:, 0, 1], torch.zeros(4))
        b.execute()
        traj, _ = b.get()
        assert torch.equal(traj.trajectories["observation/frame"][:, 0, 1], torch.full((4,), float(T)))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_while_the_batcher_starts_is_replaced(tmp_path, caplog):
    marker = tmp_path / "killed"
    env = {"n_envs": N_ENVS, "autoreset": True, "episode_lengths": (100,), "marker": str(marker), "kill_seed": 1}
    with caplog.at_level(logging.WARNING, logger="rlstruct.batchers"):
        b = RL_Batcher(T, CounterAgent, {}, StartKillEnv, env, 2, [0, 1], agent_seeds=[10, 11], restart_workers=1)
    with b:
        assert len(marker.read_text().splitlines()) == 1  # worker 1 was killed once, while building its envs
        (r,) = b.restarts
        assert (r.worker_id, r.during, r.acquisition, r.exact, r.seed, r.agent_seed) == (1, "start", 0, True, 1, 11)
        assert "SIGKILL" in r.cause and "worker 1 failed while the batcher started" in caplog.text
        # Nothing was collected yet: the replacement takes the same seeds, and the run is the one without the fault.
        b.reset()
        b.update({"scale": torch.tensor([SCALE])})
        (traj,) = _collect(b, 1)
        _check_worker_rows(traj, slice(0, 2), 0, 0)
        _check_worker_rows(traj, slice(2, 4), 1, 0)
        assert b.n_restarts == 1


@pytest.mark.parametrize("restarts", [0, 1])
def test_an_in_process_worker_that_raises_while_the_batcher_starts_is_rebuilt(monkeypatch, restarts):
    monkeypatch.setattr(RaiseOnceEnv, "raised", False)
    env = {"n_envs": N_ENVS, "autoreset": True, "episode_lengths": (100,)}
    if restarts == 0:
        with pytest.raises(BatcherWorkerError, match=r"worker 0 \(in process\) raised RuntimeError: RaiseOnceEnv"):
            RL_Batcher(T, ConstantAgent, {}, RaiseOnceEnv, env, 0, [0], restart_workers=0)
        return
    with RL_Batcher(T, ConstantAgent, {}, RaiseOnceEnv, env, 0, [0], restart_workers=restarts) as b:
        (r,) = b.restarts
        assert (r.worker_id, r.during, r.seed) == (0, "start", 0) and "RaiseOnceEnv failure injected" in r.cause
        b.reset()
        (traj,) = _collect(b, 1)
        assert torch.equal(traj.trajectories.lengths, torch.full((N_ENVS,), T))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_at_every_start_fails_the_batcher_once_the_restarts_are_spent(tmp_path):
    marker = tmp_path / "killed"
    env = {"n_envs": N_ENVS, "marker": str(marker), "every_start": True}
    every = r"(?s)worker 0 \(pid \d+\) was killed by SIGKILL.*restart_workers=2: every allowed restart has been used"
    with pytest.raises(BatcherWorkerError, match=every):
        RL_Batcher(T, ConstantAgent, {}, StartKillEnv, env, 1, [0], restart_workers=2)
    assert len(marker.read_text().splitlines()) == 3  # the first start and two replacements


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_restart_workers_is_checked(bad):
    with pytest.raises(ValueError, match=rf"restart_workers must be an int >= 0 .*got {bad!r}; pass e.g. "):
        RL_Batcher(T, ConstantAgent, {}, FaultEnv, _env(), 0, [0], restart_workers=bad)


def test_restart_seeds_are_drawn_from_the_first_seed_and_the_count():
    seeds = [restart_seed(s, n) for s in range(4) for n in range(1, 4)]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2**31 for s in seeds)
    assert WorkerRestart(1, "x", 2, "get", 3, None) == WorkerRestart(1, "x", 2, "get", 3, None)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_that_exits_after_its_acquisitions_is_not_said_to_have_failed_while_importing():
    # the worker's env exits the process (os._exit(3)) in its fourth acquisition, with no restart left
    b = _batcher(_env("exit", at_step=3 * T + 2, fault_seed=None), n_processes=1, restarts=0)
    with b:
        _collect(b, 3)
        exited = r"worker 0 \(pid \d+\) exited with code 3 without answering \(it had started and run 4 acquisition"
        with pytest.raises(BatcherWorkerError, match=exited + r"\(s\): its stderr says why") as e:
            _collect(b, 1)
    assert "importing" not in str(e.value)
