"""How worker processes start: forked from a fork server that imported torch and the worker's code once, with the
environment a spawned worker would have had; spawned where the server cannot serve (``RLSTRUCT_START_METHOD=spawn``,
a placement with variables of its own, a thread before the server exists). What a worker computes does not depend
on how it started. That a placement with variables of its own spawns its worker, which sees them, is
tests/batchers/test_batchers.py's test_worker_placements_reach_the_child_environment (its one spawned worker).
"""

from __future__ import annotations

import os
import threading
from multiprocessing import forkserver

import psutil
import pytest
import torch

from rlstruct import DictTensor
from rlstruct.batchers import RL_Batcher
from tests.fakes import ConstantAgent, CountingEnv

AUTORESET = {"n_envs": 2, "autoreset": True, "episode_lengths": (5,)}
MARK = "RLSTRUCT_TEST_WORKER_MARK"


class EnvironAgent(ConstantAgent):
    """Action 1 where the worker's environment holds :data:`MARK`, else 0: what the worker saw, in its output."""

    def __call__(self, state, observation, agent_info, history=None):
        B = observation.n_elems()
        action = torch.full((B,), int(os.environ.get(MARK) == "1"), dtype=torch.long, device=observation.device())
        return DictTensor({"action": action}), state


def _acquire(batcher: RL_Batcher) -> torch.Tensor:
    batcher.reset()
    batcher.execute()
    trajectories, _ = batcher.get()
    return trajectories.trajectories["action/action"]


def _methods(batcher: RL_Batcher) -> list[str]:
    return [w.start_method for w in batcher._workers]


@pytest.mark.slow  # a fork server and a spawned worker, each importing torch: 4-6 CPU s
@pytest.mark.timeout(120)
def test_workers_are_forked_from_the_fork_server_and_compute_what_spawned_ones_do(monkeypatch):
    """Two workers forked from the fork server, and one spawned (``RLSTRUCT_START_METHOD=spawn``) with the first's
    seed, which collects the first's rows. The spawned worker is also the spawn case of the signals' test below: it
    ignores SIGINT and SIGTERM and blocks neither, and the parent's mask is as it was (a spawn imports torch)."""
    import signal

    with RL_Batcher(3, ConstantAgent, {}, CountingEnv, AUTORESET, 2, [0, 1]) as batcher:
        forked = _acquire(batcher)
        assert _methods(batcher) == ["forkserver", "forkserver"]
        server = forkserver._forkserver._forkserver_pid
        parents = {psutil.Process(r["pid"]).ppid() for r in batcher.worker_reports()}
        assert parents == {server} and server != os.getpid()
    monkeypatch.setenv("RLSTRUCT_START_METHOD", "spawn")
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with RL_Batcher(3, ConstantAgent, {}, CountingEnv, AUTORESET, 1, [0]) as batcher:
        assert _methods(batcher) == ["spawn"]
        (report,) = batcher.worker_reports()
        assert psutil.Process(report["pid"]).ppid() == os.getpid()
        if os.path.exists("/proc/self/status"):  # the signal masks, read from /proc
            assert {signal.SIGINT, signal.SIGTERM} <= _signal_set(report["pid"], "SigIgn")
            assert not {signal.SIGINT, signal.SIGTERM} & _signal_set(report["pid"], "SigBlk")
        assert torch.equal(_acquire(batcher), forked[: AUTORESET["n_envs"]])
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


@pytest.mark.timeout(120)
def test_a_forked_worker_starts_with_the_parents_environment_of_the_moment(monkeypatch):
    with RL_Batcher(3, EnvironAgent, {}, CountingEnv, AUTORESET, 1, [0]) as batcher:
        assert not _acquire(batcher).any()  # the fork server is running from here on
    monkeypatch.setenv(MARK, "1")  # set after the server started: a spawned worker would see it, so must this one
    with RL_Batcher(3, EnvironAgent, {}, CountingEnv, AUTORESET, 1, [0]) as batcher:
        assert _methods(batcher) == ["forkserver"]
        assert _acquire(batcher).all()
        assert batcher.worker_reports()[0]["environ"]["CUDA_VISIBLE_DEVICES"] == ""  # the placement's own


@pytest.mark.timeout(120)
def test_an_unknown_start_method_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("RLSTRUCT_START_METHOD", "fork")
    with pytest.raises(ValueError, match=r"RLSTRUCT_START_METHOD must be 'forkserver' or 'spawn' .*got 'fork'; "
                                         r"unset it"):
        RL_Batcher(3, ConstantAgent, {}, CountingEnv, AUTORESET, 1, [0])


@pytest.mark.timeout(120)
def test_a_batcher_built_off_the_main_thread_works_whether_or_not_the_server_runs():
    built: list = []

    def build():
        with RL_Batcher(3, ConstantAgent, {}, CountingEnv, AUTORESET, 1, [0]) as batcher:
            built.append((_methods(batcher), _acquire(batcher)))

    thread = threading.Thread(target=build)
    thread.start()
    thread.join(100)
    with RL_Batcher(3, ConstantAgent, {}, CountingEnv, AUTORESET, 1, [0]) as batcher:
        in_main = _acquire(batcher)
    thread = threading.Thread(target=build)
    thread.start()
    thread.join(100)
    # The first thread's batcher may find the server started by an earlier test of this process, or not.
    assert built[0][0] in (["spawn"], ["forkserver"]) and built[1][0] == ["forkserver"]
    assert all(torch.equal(actions, in_main) for _, actions in built)


def _signal_set(pid: int, field: str) -> set[int]:
    """The signals of ``/proc/PID/status``'s ``field`` (``SigBlk``: blocked, ``SigIgn``: ignored)."""
    with open(f"/proc/{pid}/status") as f:
        mask = int(next(line.split()[1] for line in f if line.startswith(f"{field}:")), 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


@pytest.mark.slow  # 2.6 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the signal masks from /proc")
@pytest.mark.parametrize("method", ["forkserver"])
def test_a_worker_started_while_the_signals_are_held_ignores_them_and_blocks_none(monkeypatch, method):
    """The parent holds SIGINT and SIGTERM (blocks them) while it starts a worker, so that a Ctrl-C then is not lost
    (it reaches the parent's handler once the start is done) and cannot kill the worker while it imports: the
    worker then ignores both, and blocks neither, however it started; the fork server ignores SIGINT and holds
    SIGTERM; the parent's own mask is as it was. A spawned worker's signals are checked by
    test_workers_are_forked_from_the_fork_server_and_compute_what_spawned_ones_do, on the worker it spawns anyway."""
    import signal

    monkeypatch.setenv("RLSTRUCT_START_METHOD", method)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with RL_Batcher(3, ConstantAgent, {}, CountingEnv, AUTORESET, 1, [0]) as batcher:
        assert _methods(batcher) == [method]
        pid = batcher.worker_reports()[0]["pid"]
        assert {signal.SIGINT, signal.SIGTERM} <= _signal_set(pid, "SigIgn")
        assert not {signal.SIGINT, signal.SIGTERM} & _signal_set(pid, "SigBlk")
        if method == "forkserver":  # the server a SIGTERM to the job must not kill either (it still holds it)
            server = forkserver._forkserver._forkserver_pid
            assert signal.SIGINT in _signal_set(server, "SigIgn")
            assert signal.SIGTERM in _signal_set(server, "SigBlk") | _signal_set(server, "SigIgn")
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
