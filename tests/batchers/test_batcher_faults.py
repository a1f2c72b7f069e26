"""RL_Batcher under faults: interrupts mid-exchange, dead and hung workers, closing with work pending, a parent
that dies, envs and agents that break the buffer's layout, and bad constructor arguments.

Faults are injected with the small fakes of :mod:`tests.fakes` (importable, since ``spawn`` workers import them).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from rlstruct import DictTensor
from rlstruct.batchers import RayBatcher, RL_Batcher
from rlstruct.batchers import _replace as replace_module
from rlstruct.batchers._child import STOP_SIGNAL
from rlstruct.errors import (
    BatcherStateError,
    BatcherWorkerError,
    BatcherWorkerTimeout,
    BatchSizeError,
    ConfigError,
    DeviceUnavailableError,
    SpaceError,
)
from tests.fakes import (
    CloseRaisingEnv,
    ConstantAgent,
    CounterAgent,
    CountingEnv,
    DriftAgent,
    DriftEnv,
    HangingAgent,
    InterruptingAgent,
    MarkerCloseEnv,
    SlowAgent,
    pid_alive,
)
from tests.helpers import ForkedCommand, wall_limit

AUTORESET = {"n_envs": 2, "autoreset": True, "episode_lengths": (100,)}
EPISODIC = {"n_envs": 3, "autoreset": False, "episode_lengths": (9,)}


def _pids(b: RL_Batcher) -> list[int]:
    return [r["pid"] for r in b.worker_reports()]


def _wait_gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _markers(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


# --------------------------------------------------------------------------- 1. interrupts mid-exchange
def _interrupting_recv_all(monkeypatch, exc: type[BaseException], after: float = 0.2) -> None:
    """Makes the batcher's wait for replies raise ``exc`` after ``after`` s, as a Ctrl-C landing while it waits:
    the workers have the request, its replies stay unread."""
    real = replace_module.recv_all

    def interrupted(workers, timeout):
        time.sleep(after)
        monkeypatch.setattr(replace_module, "recv_all", real)
        raise exc()

    monkeypatch.setattr(replace_module, "recv_all", interrupted)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["reset", "update", "get"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_while_waiting_on_workers_fails_the_batcher(monkeypatch, method, exc):
    b = RL_Batcher(3, CounterAgent, {}, CountingEnv, AUTORESET, 1, [0], timeout=20)
    pids = _pids(b)
    b.reset()
    calls = {"reset": b.reset, "update": lambda: b.update({"scale": torch.ones(1)}), "get": b.get}
    if method == "get":
        b.execute()
    _interrupting_recv_all(monkeypatch, exc)
    with pytest.raises(exc):
        calls[method]()
    # The replies are out of step: every later call is refused, rather than reading the interrupted one's reply.
    for later in ("reset", "execute"):
        with pytest.raises(BatcherStateError, match=rf"{later}\(\) called after {method}\(\) was interrupted by "
                                                     rf"{exc.__name__}.*close\(\) it and build a new one"):
            getattr(b, later)()
    t = time.monotonic()
    b.close()
    assert time.monotonic() - t < wall_limit(5)
    assert _wait_gone(pids, 5) and not mp.active_children()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("exc", ["KeyboardInterrupt", "SystemExit"])
def test_an_interrupt_during_an_in_process_acquisition_fails_the_batcher(exc):
    # The env took steps the buffer never recorded: going on would hand out trajectories with a hole in them.
    b = RL_Batcher(3, InterruptingAgent, {"at": 6, "exc": exc}, CountingEnv, AUTORESET, 0, [0])
    b.reset()
    b.execute()
    b.get()
    with pytest.raises({"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit}[exc]):
        b.execute()
    with pytest.raises(BatcherStateError, match=rf"execute\(\) called after execute\(\) was interrupted by {exc}"):
        b.execute()
    b.close()
    b.close()  # idempotent


# --------------------------------------------------------------------------- 2. non-blocking get
@pytest.mark.timeout(60)
def test_a_non_blocking_get_reports_a_dead_worker_while_another_is_busy():
    # Both workers hang in env.step (worker 0 stays busy); worker 1 is killed.
    b = RL_Batcher(3, ConstantAgent, {}, CountingEnv, {**AUTORESET, "hang_at_step": 2}, 2, [0, 1], timeout=30)
    pids = _pids(b)
    b.reset()
    b.execute()
    os.kill(pids[1], signal.SIGKILL)
    # Polled until the kernel has torn worker 1 down (its pipe closes last); worker 0 stays busy throughout.
    deadline = time.monotonic() + 5
    with pytest.raises(BatcherWorkerError, match=r"worker 1 \(pid \d+\) was killed by SIGKILL") as e:
        while time.monotonic() < deadline:
            assert b.get(blocking=False) == (None, None)
            time.sleep(0.02)
    assert e.value.worker_id == 1
    with pytest.raises(BatcherStateError, match="after a worker failed"):
        b.get()
    t = time.monotonic()
    b.close()  # worker 0 is still hung in env.step
    assert time.monotonic() - t < wall_limit(5)
    assert _wait_gone(pids, 5)


# --------------------------------------------------------------------------- 2b. hangs: start_timeout, then timeout
@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["env", "agent"])
@pytest.mark.slow
def test_a_hang_in_the_first_acquisition_is_reported_after_timeout_not_the_start_bound(where):
    # The agent's first call (the probe) is part of the start; its second is the first acquisition's first step.
    agent, agent_args, env_args = ((ConstantAgent, {}, {**AUTORESET, "hang_at_step": 1}) if where == "env" else
                                   (HangingAgent, {"hang_at_call": 2}, AUTORESET))
    # A 1 s timeout: the healthy replies before the hang (the reset's) take milliseconds on a machine loaded 2x.
    b = RL_Batcher(3, agent, agent_args, CountingEnv, env_args, 1, [0], timeout=1)
    try:
        b.reset()
        start = time.monotonic()
        b.execute()
        with pytest.raises(BatcherWorkerTimeout, match=r"worker 0 did not answer within 1 s, the batcher's "
                                                       r"`timeout`; raise `timeout` if an acquisition"):
            b.get()
        assert time.monotonic() - start < wall_limit(60)  # the start's bound (120 s by default) does not apply
    finally:
        b.close()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_hang_while_the_batcher_starts_is_reported_naming_start_timeout():
    # The agent hangs in its first call, the probe that sizes the buffer: within the start, bounded by start_timeout,
    # not by the (shorter) timeout of the acquisitions. The worker starts from the fork server (torch imported there
    # already): a start that outlasted start_timeout on a busy machine would fail the same way, at start_timeout.
    before = set(mp.active_children())
    start = time.monotonic()
    with pytest.raises(BatcherWorkerTimeout, match=r"worker 0 did not answer within 2 s, the batcher's "
                                                   r"`start_timeout`; raise `start_timeout` if a worker's start"):
        RL_Batcher(3, HangingAgent, {"hang_at_call": 1}, CountingEnv, AUTORESET, 1, [0], timeout=0.5,
                   start_timeout=2)
    took = time.monotonic() - start
    assert 2 <= took < wall_limit(41), took  # four times the acquisitions' timeout: the start's bound, not theirs
    assert set(mp.active_children()) == before  # the hung worker was stopped


# --------------------------------------------------------------------------- 3. close with work pending
@pytest.mark.timeout(60)
def test_close_waits_for_a_pending_acquisition_and_closes_the_env(tmp_path):
    marker = tmp_path / "closed"
    b = RL_Batcher(5, SlowAgent, {"delay": 0.2}, MarkerCloseEnv, {**AUTORESET, "marker": str(marker)}, 1, [0])
    pids = _pids(b)
    b.reset()
    b.execute()  # a healthy acquisition of about 1 s
    t = time.monotonic()
    b.close()
    assert time.monotonic() - t < wall_limit(5)
    assert _markers(marker) == ["closed", str(pids[0])]
    assert _wait_gone(pids, 2)


@pytest.mark.timeout(60)
def test_a_worker_told_to_stop_still_closes_its_env(tmp_path, caplog):
    # The worker hangs in env.step: close() gives up after its grace and sends SIGUSR1, which the worker turns into
    # an exception, so that its finally still closes the env.
    marker = tmp_path / "closed"
    env_args = {**AUTORESET, "marker": str(marker), "hang_at_step": 2}
    b = RL_Batcher(3, ConstantAgent, {}, MarkerCloseEnv, env_args, 1, [0], timeout=1)
    pids = _pids(b)
    b.reset()
    b.execute()
    with caplog.at_level(logging.WARNING, logger="rlstruct.batchers.batcher"):
        t = time.monotonic()
        b.close()
        assert time.monotonic() - t < wall_limit(5)
    assert _markers(marker) == ["closed", str(pids[0])]
    assert "worker 0 had not stopped 1 s after the close order" in caplog.text
    assert f"it was sent {STOP_SIGNAL.name}" in caplog.text
    assert _wait_gone(pids, 2)


@pytest.mark.timeout(60)
@pytest.mark.skipif(STOP_SIGNAL == signal.SIGTERM, reason="no SIGUSR1 here: SIGTERM is the stop signal")
def test_workers_ignore_a_sigterm_to_the_job_and_wait_for_their_parent(tmp_path):
    # A scheduler (SLURM) sends SIGTERM to every process of the job: the parent stops the run cleanly, so its
    # workers must still answer, then close their envs when it closes them.
    marker = tmp_path / "closed"
    b = RL_Batcher(3, ConstantAgent, {}, MarkerCloseEnv, {**AUTORESET, "marker": str(marker)}, 1, [0], timeout=10)
    pids = _pids(b)
    b.reset()
    os.kill(pids[0], signal.SIGTERM)
    time.sleep(0.3)
    b.execute()
    traj, n_running = b.get()
    assert traj.n_elems() == n_running > 0  # an auto-reset acquisition: every env, still running
    b.close()
    assert _markers(marker) == ["closed", str(pids[0])]
    assert _wait_gone(pids, 2)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_workers_hung_in_close_share_one_deadline(tmp_path):
    marker = tmp_path / "closed"
    env_args = {**AUTORESET, "marker": str(marker), "hang_in_close": True}
    b = RL_Batcher(3, ConstantAgent, {}, MarkerCloseEnv, env_args, 2, [0, 1], timeout=4)
    pids = _pids(b)
    b.reset()
    t = time.monotonic()
    b.close()
    # One 4 s grace for both, then the stop signal ends both closes at once. Graces in turn would take 8 s before
    # any signal; what is allowed above the one grace is the workers' own exit (a torch interpreter's teardown,
    # which took up to 1.6 s on a loaded 2-core machine, 2.2 s with eight jobs on its 2 cores): half-way between.
    assert time.monotonic() - t < wall_limit(7.5)
    assert sorted(_markers(marker)[1::2]) == sorted(str(p) for p in pids)
    assert _wait_gone(pids, 2)


# --------------------------------------------------------------------------- 4. workers die with their parent
def _orphaned_worker(pid_file: Path) -> int:
    """The learner, a child forked from the test's process (:class:`~tests.helpers.ForkedCommand`: its own fork server
    and resource tracker, as a fresh interpreter's): its worker stuck in env.step (a hung simulator), it is
    OOM-killed, so that no close() and no atexit runs."""
    env_args = {"n_envs": 2, "autoreset": True, "hang_at_step": 2}
    b = RL_Batcher(3, ConstantAgent, {}, CountingEnv, env_args, 1, [0], timeout=60)
    pid_file.write_text(str(b.worker_reports()[0]["pid"]))
    b.reset()
    b.execute()
    time.sleep(0.5)  # the worker is now stuck in env.step
    os.kill(os.getpid(), signal.SIGKILL)
    return 0


@pytest.mark.slow  # the learner's own fork server imports torch: 1.5-2 CPU s that the guard does not see (orphaned)
@pytest.mark.timeout(90)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_worker_dies_with_its_parent(tmp_path):
    # Forked rather than a fresh interpreter, which would spend seconds importing torch before its batcher starts.
    pid_file = tmp_path / "worker"
    learner = ForkedCommand([], tmp_path / "learner", call=lambda: _orphaned_worker(pid_file))
    try:
        assert learner.wait(60) == -signal.SIGKILL, learner.stderr
    finally:
        learner.kill()
    worker = int(pid_file.read_text())
    assert _wait_gone([worker], 5), f"worker {worker} outlived its parent"


# --------------------------------------------------------------------------- 5. errors while closing
@pytest.mark.timeout(60)
@pytest.mark.parametrize("n_processes", [0, 1])
def test_an_env_raising_in_close_is_logged_in_the_parent(n_processes, caplog, capfd):
    b = RL_Batcher(3, ConstantAgent, {}, CloseRaisingEnv, AUTORESET, n_processes, [0])
    processes = [w.process for w in b._workers if hasattr(w, "process")]
    b.reset()
    b.execute()
    b.get()
    with caplog.at_level(logging.WARNING, logger="rlstruct.batchers.batcher"):
        b.close()
    assert "errors while closing workers" in caplog.text
    assert "RuntimeError" in caplog.text and "close failure injected" in caplog.text
    # Not an uncaught traceback on the worker's stderr, and not a failed worker process.
    assert "Traceback" not in capfd.readouterr().err
    assert all(p.exitcode == 0 for p in processes)


# --------------------------------------------------------------------------- 6. the buffer's layout
@pytest.mark.timeout(60)
@pytest.mark.parametrize("env_args", [AUTORESET, EPISODIC], ids=["autoreset", "episodic"])
@pytest.mark.parametrize("drift,match", [
    ("shape", r"'frame' with rows of shape \(1,\) and dtype torch.float32, but .* rows of shape \(2,\)"),
    ("dtype", r"'frame' with rows of shape \(2,\) and dtype torch.float64, but .* dtype torch.float32"),
])
def test_env_observations_leaving_the_reset_layout_are_refused(env_args, drift, match):
    # Without the check a [B, 1] frame is broadcast into the buffer's [B, 2], and float64 cast, silently.
    with RL_Batcher(3, ConstantAgent, {}, DriftEnv, {**env_args, "drift": drift}, 0, [0]) as b:
        b.reset()
        b.execute()
        with pytest.raises(BatcherWorkerError, match="raised SpaceError: .*" + match) as e:
            b.get()
    assert isinstance(e.value.__cause__, SpaceError)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env_args", [AUTORESET, EPISODIC], ids=["autoreset", "episodic"])
@pytest.mark.parametrize("kind,error,match", [
    ("extra", SpaceError, r"keys \['action', 'extra', 'value'\].*unexpected \['extra'\]"),
    ("drop", SpaceError, r"keys \['action'\].*missing \['value'\]"),
    ("column", SpaceError, r"'action' with rows of shape \(1,\) and dtype torch.int64.*rows of shape \(\) and dtype "
                           r"torch.int64"),
    ("float", SpaceError, r"'action' with rows of shape \(\) and dtype torch.float32.*torch.int64"),
    ("rows", BatchSizeError, r"'action' with shape \((3|4),\), the buffer needs one row per running env"),
    ("state", SpaceError, r"'h' with rows of shape \(4,\).*agent_state/h as rows of shape \(3,\)"),
])
@pytest.mark.parametrize("at", [2, 4], ids=["first-step", "later-step"])
def test_agent_outputs_leaving_the_probe_layout_are_refused(env_args, kind, error, match, at):
    # The probe is call 1; call 2 is the first step of the first acquisition, call 4 its third.
    n_envs = env_args["n_envs"]
    with RL_Batcher(3, DriftAgent, {"kind": kind, "at": at}, CountingEnv, env_args, 0, [0]) as b:
        b.reset()
        with pytest.raises(BatcherWorkerError, match=match) as e:
            for _ in range(3):  # the state is written when the next acquisition starts
                b.execute()
                b.get()
    assert isinstance(e.value.__cause__, error)
    if kind == "rows":
        assert f"({n_envs},)" in str(e.value)


def test_step_into_refuses_destinations_of_another_layout():
    # VecEnv's generic step_into (step, then a copy): copy_ alone would broadcast or cast.
    env = CountingEnv(n_envs=2, autoreset=True)
    obs, _ = env.reset()
    action = DictTensor({"action": torch.zeros(2, dtype=torch.long)})

    def like(**changed):
        return DictTensor({**{k: v.clone() for k, v in obs.items()}, **changed})

    with pytest.raises(SpaceError, match=r"CountingEnv.step returned observation key 'frame' with rows of shape "
                                         r"\(2,\) and dtype torch.float32, but step_into's observation_running holds "
                                         r"rows of shape \(5,\)"):
        env.step_into(action, like(), like(frame=torch.zeros(2, 5)))
    with pytest.raises(SpaceError, match=r"'reward' with rows of shape \(\) and dtype torch.float32, but "
                                         r"step_into's observation_next holds rows of shape \(\) and dtype "
                                         r"torch.float64"):
        env.step_into(action, like(reward=torch.zeros(2, dtype=torch.float64)), like())
    with pytest.raises(BatchSizeError, match=r"'frame' with shape \(2, 2\), but step_into's observation_next "
                                             r"holds 3 rows"):
        env.step_into(action, DictTensor({k: torch.cat([v, v[:1]]) for k, v in obs.items()}), like())


# --------------------------------------------------------------------------- 7. constructor arguments
def test_constructor_arguments_are_checked_before_anything_starts():
    def make(**kw):
        args = {"n_timesteps": 3, "n_processes": 0, "seeds": [0], **kw}
        return RL_Batcher(args["n_timesteps"], ConstantAgent, {}, CountingEnv, EPISODIC, args["n_processes"],
                          args["seeds"], **{k: v for k, v in kw.items() if k not in ("n_timesteps", "n_processes",
                                                                                    "seeds")})

    with pytest.raises(ConfigError, match=r"agent_seeds must hold one seed per worker \(1\), got 2"):
        make(agent_seeds=[1, 2])
    with pytest.raises(TypeError, match=r"with one seed \(seeds=0\) each worker calls create_env\(\*\*env_args, "
                                        r"seed=\.\.\., env_index=i\).*CountingEnv takes no env_index; add an "
                                        r"env_index=0 parameter .* or pass one seed per worker"):
        make(seeds=0)
    with pytest.raises(TypeError, match="seeds must be a sequence of ints.*got NoneType None"):
        make(seeds=None)
    with pytest.raises(TypeError, match="agent_seeds must be a sequence of ints.*got int 3"):
        make(agent_seeds=3)
    with pytest.raises(TypeError, match="timeout must be a number of seconds > 0, got NoneType None"):
        make(timeout=None)
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="timeout must be > 0 seconds"):
            make(timeout=bad)
        with pytest.raises(ValueError, match=r"start_timeout must be > 0 seconds or None, got .*start_timeout=300"):
            make(start_timeout=bad)
    for bad in ("60", True):
        with pytest.raises(TypeError, match=r"start_timeout must be a number of seconds > 0 or None, got "
                                            r"(str '60'|bool True)"):
            make(start_timeout=bad)
    with pytest.raises(TypeError, match="n_timesteps must be an int >= 1, got bool True"):
        make(n_timesteps=True)
    with pytest.raises(TypeError, match="n_timesteps must be an int >= 1, got float 3.0"):
        make(n_timesteps=3.0)
    with pytest.raises(BatchSizeError, match=r"agent_info must hold at least one row, but key 'bonus' has shape "
                                             r"\(0,\)"):
        make(agent_info=DictTensor({"bonus": torch.zeros(0)}))
    with pytest.raises(BatchSizeError, match=r"env_info must hold rows \[B, ...\], but key 'level' is 0-d"):
        make(env_info=DictTensor({"level": torch.tensor(1.0)}))
    with pytest.raises(DeviceUnavailableError, match=r"device='cuda:64' does not exist on this machine"):
        make(device="cuda:64")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["env_args", "agent_args"])
def test_unpicklable_args_are_named_before_any_process_starts(name):
    args = {"env_args": dict(EPISODIC), "agent_args": {}}
    args[name]["lock"] = threading.Lock()  # refused before the agent or env is ever built
    before = set(mp.active_children())
    with pytest.raises(TypeError, match=rf"{name} must be picklable to reach a worker process, but "
                                        rf"{name}\['lock'\] = <.*lock.*> is not"):
        RL_Batcher(3, ConstantAgent, args["agent_args"], CountingEnv, args["env_args"], 1, [0])
    assert set(mp.active_children()) == before


def test_the_ray_batcher_shares_the_argument_checks():
    with pytest.raises(ConfigError, match=r"one seed per worker of every actor.*= 4, got 2"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 2, [0, 1], n_actors=2)
    with pytest.raises(TypeError, match="timeout must be a number of seconds > 0, got NoneType None"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0], timeout=None)
    with pytest.raises(ValueError, match="start_timeout must be > 0 seconds or None, got 0"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0], start_timeout=0)
    with pytest.raises(TypeError, match="start_timeout must be a number of seconds > 0 or None, got str '5'"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0], start_timeout="5")
    with pytest.raises(BatchSizeError, match="agent_info must hold at least one row, but key 'bonus'"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0],
                   agent_info=DictTensor({"bonus": torch.zeros(0)}))
