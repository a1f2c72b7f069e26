"""Assertions, arguments and fault injections shared by the test modules (importable: no test module imports
another)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rlstruct import DictTensor, Trajectories
from rlstruct.errors import BatcherStateError

__all__ = ["AUTORESET", "EPISODIC", "ForkedCommand", "acquire_around_changes", "assert_refused_while_pending",
           "assert_same", "bare_run", "get_when_ready", "rlstruct_in_process", "run_generated_suite",
           "sigkill_a_worker", "training_runs_with", "wall_limit"]

ROOT = Path(__file__).resolve().parents[1]
#: how many times longer than on the reference machine, quiet, work takes now: set by tests/conftest.py as each test
#: starts (its ``wall_clock_scale``), 1 outside a test
WALL_SCALE = 1.0


def wall_limit(seconds: float) -> float:
    """A wall-clock limit of ``seconds`` on the reference machine, quiet, scaled to this machine and its load now
    (:data:`WALL_SCALE`): for a subprocess's ``timeout=``, which ends a hang, not a slow run on a busy machine."""
    return seconds * WALL_SCALE

#: the ini of a generated suite: the suite's own markers, strictly
GENERATED_INI = """[pytest]
addopts = --strict-markers
markers =
    long(reason): may take long
    slow: slow
    ray: a Ray test
    cuda: needs a GPU
    compiles: compiles
"""


def run_generated_suite(folder: Path, source: str, *args: str, env: dict[str, str] | None = None,
                        timeout: float = 100) -> subprocess.CompletedProcess:
    """Runs pytest, with this suite's conftest as a plugin, on ``source`` written as ``folder/test_generated.py``
    (beside :data:`GENERATED_INI`), in a subprocess; ``args`` go before the file, ``env`` adds to the environment."""
    (folder / "pytest.ini").write_text(GENERATED_INI)
    (folder / "test_generated.py").write_text(source)
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", *args,
                           "test_generated.py"], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)

def rlstruct_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """``rlstruct *args`` through the console script's entry point in this process: its status and what it printed.
    For a command that prints and exits without training (``--show-config``, ``presets``, an argument refused):
    a fresh process would spend two seconds importing torch to say it."""
    from rlstruct.algos._train import cli

    capsys.readouterr()
    try:
        status = cli.main(list(args))
    except SystemExit as e:  # argparse's own exit
        status = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return subprocess.CompletedProcess(["rlstruct", *args], status, out.out, out.err)


#: the warning filters a fresh interpreter starts with (a release build, no ``-W``), before ``sys.warnoptions``
_FRESH_WARNING_FILTERS = [("default", None, DeprecationWarning, "__main__", 0),
                          ("ignore", None, DeprecationWarning, None, 0),
                          ("ignore", None, PendingDeprecationWarning, None, 0),
                          ("ignore", None, ImportWarning, None, 0),
                          ("ignore", None, ResourceWarning, None, 0)]
#: seconds the child's end waits for the fork server and the resource tracker it started to exit (as a fresh
#: interpreter's exit does, :mod:`rlstruct.batchers._lifecycle`)
_HELPERS_GRACE_S = 5.0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """What a fresh interpreter does with a warning: its formatted lines on stderr."""
    with contextlib.suppress(OSError):
        (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))


def _start_as_a_fresh_process(out_fd: int, err_fd: int) -> None:
    """In a child just forked from the test's process: the state a fresh interpreter starts with, wherever pytest's
    would change what a command does, where its output goes, or who owns the processes it starts.

    Its own process group; ``out_fd`` and ``err_fd`` as descriptors 1 and 2, so that what its processes (a fork
    server, batcher workers) and C code write lands beside what it prints; Python's signal dispositions (SIGINT's
    ``default_int_handler``, SIGPIPE and SIGXFSZ ignored, the rest default; a handler set outside Python is kept, as
    it is the same import's in both) and no signal blocked; no fault handler; the root logger without pytest's
    capture handlers, so that the command's ``basicConfig`` takes effect; warnings printed under a fresh
    interpreter's filters, not recorded by pytest; ``python -m rlstruct.algos``'s ``__main__``; and
    multiprocessing's fork server and resource tracker its own, started on first use: the parent's are forgotten
    (their pipes closed here: each exits when its last holder has), with the parent's children and finalizers, as
    multiprocessing does in a child it forks."""
    import faulthandler
    import logging
    from multiprocessing import forkserver, process, resource_tracker, util

    os.setpgid(0, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    fresh = {signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN,
             signal.SIGXFSZ: signal.SIG_IGN}
    for signum in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
        with contextlib.suppress(OSError, ValueError):  # a number the C library reserves
            handler = signal.getsignal(signum)
            if handler is not None and handler != fresh.get(signum, signal.SIG_DFL):
                signal.signal(signum, fresh.get(signum, signal.SIG_DFL))
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    faulthandler.disable()
    root = logging.getLogger()
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    warnings.filters[:] = _FRESH_WARNING_FILTERS
    warnings._processoptions(sys.warnoptions)
    warnings.showwarning = _show_warning
    for helper, fd_name in ((forkserver._forkserver, "_forkserver_alive_fd"),
                            (resource_tracker._resource_tracker, "_fd")):
        fd = getattr(helper, fd_name, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        helper.__init__()  # in place: the modules' functions are bound methods of these instances
    process._children = set()
    util._finalizer_registry.clear()
    util._run_after_forkers()
    batchers = sys.modules.get("rlstruct.batchers._parent")
    if batchers is not None:
        batchers._server_started_by = None  # the parent's fork server is not this child's to fork from
    # ``python -m rlstruct.algos``'s main module, which a worker imports again (as ``__mp_main__``), not pytest's
    sys.modules["__main__"] = importlib.import_module("rlstruct.algos.__main__")


def _use_temp_folder(temp: str) -> None:
    """In a child just forked from the test's process: ``temp`` as its temp folder, as an interpreter started with
    ``TMPDIR=temp`` has it: :mod:`tempfile` reads it on first use, and multiprocessing makes its own folder (its fork
    server's socket) in there on first use, not in the parent's."""
    from multiprocessing import process

    os.environ["TMPDIR"] = temp
    tempfile.tempdir = None
    process.current_process()._config.pop("tempdir", None)


def _end_as_a_fresh_process() -> None:
    """What a fresh interpreter's exit does for the processes a command started: rlstruct's exit hook (a batcher
    left open closed, multiprocessing's own exit) and the fork server and resource tracker stopped and reaped, so
    that none outlives the child and their CPU time is counted as the child's."""
    from rlstruct.batchers import _lifecycle

    if _lifecycle._HOOKED:
        _lifecycle.close_all_at_exit()
    else:
        _lifecycle.reap_fork_server(_HELPERS_GRACE_S)
        _lifecycle.reap_resource_tracker(_HELPERS_GRACE_S)


class ForkedCommand:
    """``rlstruct ARGV`` in a child forked from this process, started as a fresh interpreter would be
    (:func:`_start_as_a_fresh_process`: a process group of its own, as ``subprocess``'s ``start_new_session``,
    Python's signal handlers, no pytest state), its stdout and stderr written to ``output`` (``.out`` and ``.err``
    beside it): for a test that signals, stops or kills a run, where a fresh interpreter would spend seconds
    importing torch to get there. ``seam()``, when given, runs in the child first (a fault's trigger); ``call()``,
    when given, runs in place of the command, its return the child's status (a child that does more than one
    command). A run with batcher worker processes (``--n-processes``) starts its own fork server and resource
    tracker, in the child's group, and stops them at its end as an interpreter's exit does. ``temp``, when given, is
    the child's temp folder, as for an interpreter started with ``TMPDIR=temp`` (:mod:`tempfile`'s and
    multiprocessing's, whose fork server's socket lives there): a folder the test reads or removes after the child
    (one it kills leaves that socket's folder).

    The child never returns into pytest: it ends with ``os._exit`` and the command's status (``os.EX_SOFTWARE`` and
    the traceback in ``.err`` if the command raised)."""

    def __init__(self, argv: list[str], output: Path, *, seam: Callable[[], None] | None = None,
                 call: Callable[[], int] | None = None, temp: str | None = None):
        from rlstruct.algos._train import cli

        self.stdout_path, self.stderr_path = output.with_suffix(".out"), output.with_suffix(".err")
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid:
            # the child's own group from here on, whichever of the two calls comes first
            with contextlib.suppress(OSError):
                os.setpgid(self.pid, self.pid)
            return
        status = os.EX_SOFTWARE
        try:
            with open(self.stdout_path, "w") as out, open(self.stderr_path, "w", buffering=1) as err:
                _start_as_a_fresh_process(out.fileno(), err.fileno())
                if temp is not None:
                    _use_temp_folder(temp)
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    try:
                        try:
                            if seam is not None:
                                seam()
                            status = cli.main(argv) if call is None else call()
                        finally:
                            _end_as_a_fresh_process()
                    except SystemExit as e:
                        status = e.code if isinstance(e.code, int) else 1
                    except BaseException:
                        import traceback

                        traceback.print_exc()
        finally:
            os._exit(status)

    def poll(self) -> int | None:
        """The child's return code as ``subprocess`` gives it (-9: SIGKILLed), or ``None`` while it runs."""
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        """Waits for the child at most ``wall_limit(timeout)`` (then SIGKILLs it and raises); its return code."""
        deadline = time.monotonic() + wall_limit(timeout)
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the forked command did not end within {wall_limit(timeout):.0f} s")
            time.sleep(0.05)
        return self.returncode

    def completed(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        """Waits for the child as :meth:`wait` does (killing it and raising past ``wall_limit(timeout)``), then
        gives its status and output as ``subprocess.run(args, capture_output=True, text=True)`` would."""
        try:
            self.wait(timeout)
        finally:
            self.kill()
        return subprocess.CompletedProcess(args, self.returncode, self.stdout, self.stderr)

    def kill(self) -> None:
        """SIGKILLs the child's process group and reaps the child, if it still runs."""
        if self.poll() is None:
            for kill in (os.killpg, os.kill):  # its group, and it, should it not lead one yet
                with contextlib.suppress(ProcessLookupError):
                    kill(self.pid, signal.SIGKILL)
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text()

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()


EPISODIC = {"n_envs": 3, "episode_lengths": (2, 4, 7)}
AUTORESET = {"n_envs": 3, "episode_lengths": (2, 4, 7), "autoreset": True}


def bare_run(logdir: Path | str, **settings: Any) -> dict[str, Any]:
    """A quiet run's config fields for the bare algorithm (``preset="none"``), into ``logdir``: tests that compare
    mechanisms give their own sizes and budgets in ``settings``."""
    return {"progress": False, "tensorboard": False, "logdir": str(logdir), "time_limit": 300.0,
            "stop_at_reward_threshold": False, "preset": "none", **settings}


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Runs the block with ``n`` torch threads: the workers' count (one on the CPU) for an in-process reference. A
    matrix product over more threads splits its sums another way (the MinAtar CNN's 1,024 x 128 layer over 16 rows),
    so the same rows are only the same bits at the same thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def assert_same(a: Trajectories, b: Trajectories) -> None:
    """``a`` and ``b`` hold the same keys, lengths, and bits wherever a step is valid."""
    assert list(a.info.keys()) == list(b.info.keys())
    assert list(a.trajectories.keys()) == list(b.trajectories.keys())
    assert torch.equal(a.trajectories.lengths, b.trajectories.lengths)
    m = a.trajectories.mask().bool()
    for k in a.trajectories.keys():
        assert torch.equal(a.trajectories[k][m], b.trajectories[k][m]), k
    for k in a.info.keys():
        assert torch.equal(a.info[k], b.info[k]), k


def assert_refused_while_pending(b) -> None:
    """``b`` (any batcher, an execute pending) refuses update, reset and a second execute until get."""
    with pytest.raises(BatcherStateError, match="pending; call get"):
        b.update({})
    with pytest.raises(BatcherStateError, match="pending; call get"):
        b.reset()
    with pytest.raises(BatcherStateError, match="another execute"):
        b.execute()


def get_when_ready(b, seconds: float = 60.0) -> tuple[Trajectories, int]:
    """The pending acquisition of ``b``, polled with ``get(blocking=False)`` until it is ready (at most ``seconds``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        traj, n = b.get(blocking=False)
        if traj is not None:
            return traj, n
    raise AssertionError(f"the acquisition was not ready within {seconds:g} s")


def acquire_around_changes(b, new_weights: Callable[[], dict], agent_info: Callable[[float], DictTensor]) -> list:
    """Ten acquisitions of ``b`` around every change a captured step loop must see: four (eager, captured, replayed,
    replayed), two after ``update(new_weights())``, two after a reset with ``agent_info(0.5)``, and two with
    ``agent_info(2.0)`` given to the first ``execute``. Every env runs in each."""
    out: list[Trajectories] = []

    def acquire(times: int, info: DictTensor | None = None) -> None:
        for _ in range(times):
            b.execute(info)
            info = None
            traj, n_running = b.get()
            assert n_running == b.n_elems()
            out.append(traj)

    b.reset()
    acquire(4)
    b.update(new_weights())
    acquire(2)
    b.reset(agent_info=agent_info(0.5))
    acquire(2)
    acquire(2, agent_info(2.0))
    return out


def sigkill_a_worker(proc: subprocess.Popen | ForkedCommand, progress_csv: Path, after_rows: int,
                     within_s: float = 300) -> int | None:
    """SIGKILLs one batcher worker process of ``proc`` (an ``rlstruct train`` run) once its ``progress_csv`` has more
    than ``after_rows`` lines; returns the pid killed, or ``None`` when the run ended first or ``within_s`` passed."""
    import psutil

    def command(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:  # a child that exited since it was listed
            return ""

    deadline = time.monotonic() + within_s
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
        rows = progress_csv.read_text().count("\n") if progress_csv.exists() else 0
        if rows <= after_rows:
            continue
        try:
            children = psutil.Process(proc.pid).children()
            # The workers: the fork server's children (a forked worker's command line is the server's), or
            # spawned children of the run (a placement with variables of its own).
            workers = [w for p in children if "forkserver" in command(p) for w in p.children()]
        except psutil.Error:  # the run ended since
            continue
        workers += [p for p in children if "spawn_main" in command(p)]
        if workers:
            os.kill(workers[0].pid, signal.SIGKILL)
            return workers[0].pid
    return None


def train_with_a_worker_killed(argv: list[str], logdir: Path, after_rows: int,
                               timeout: float) -> tuple[int | None, subprocess.CompletedProcess]:
    """Runs ``rlstruct ARGV`` (a ``train`` writing to ``logdir``) forked from this process (:class:`ForkedCommand`,
    whose workers come from a fork server of its own, as a fresh process's do), SIGKILLs one of its batcher workers
    once its progress.csv has more than ``after_rows`` lines (:func:`sigkill_a_worker`), and waits for it at most
    ``wall_limit(timeout)``: the pid killed (``None``: the run ended first) and the finished run (its return code,
    stdout and stderr)."""
    run = ForkedCommand(argv, logdir.parent / f"{logdir.name}-command")
    try:
        killed = sigkill_a_worker(run, logdir / "progress.csv", after_rows=after_rows)
        run.wait(timeout)
    finally:
        run.kill()
    return killed, subprocess.CompletedProcess(["rlstruct", *argv], run.returncode, run.stdout, run.stderr)


@contextlib.contextmanager
def training_runs_with(*, seed: int | None = None, torch_threads: int | None = None,
                       results: list | None = None) -> Iterator[None]:
    """Within it, every training run of this process (``a2c.train``, ``ppo.train``, a tutorial's ``train``...) runs
    with ``seed`` and ``torch_threads`` in place of its config's (``None``: the config's own), and appends its
    :class:`~rlstruct.algos._train.result.TrainResult` to ``results`` when given: how a learning test is run over
    seeds and thread counts unchanged (``--torch-threads``, ``benchmarks/thresholds.py``)."""
    from rlstruct.algos._train import loops, train_command

    changes = {k: v for k, v in (("seed", seed), ("torch_threads", torch_threads)) if v is not None}
    validate, run = loops.validate, loops.run

    def validate_with(algorithm, config, **kwargs: Any):  # every train() validates its config first
        return validate(algorithm, dataclasses.replace(config, **changes), **kwargs)

    def run_and_record(setup):
        result = run(setup)
        if results is not None:
            results.append(result)
        return result

    # the harness's two callers of validate and run: an algorithm's train, and the command line
    modules = (loops, train_command)
    for module in modules:
        module.validate, module.run = validate_with, run_and_record
    try:
        yield
    finally:
        for module in modules:
            module.validate, module.run = validate, run


@contextlib.contextmanager
def user_module(folder: Path, name: str, source: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module of a user's own, ``name``, written into ``folder`` and importable while the block runs (then
    forgotten, so that another test's module of the same name is imported afresh)."""
    (folder / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(folder))
    try:
        yield name
    finally:
        sys.modules.pop(name, None)


def assert_learned_within_budget(result: Any, logdir: Path, *, best: float, final: float, budget: int,
                                 target: float) -> None:
    """A learning test's run (the result of an algorithm's ``train``) held to its thresholds: its best periodic
    evaluation at or above ``best``, its final return at or above ``final``, finite losses; it spent its env-step
    ``budget``, or stopped before it where an evaluation and its confirmation on fresh episodes reached its preset's
    ``target`` (reporting the confirmation); and it left its checkpoint in ``logdir``."""
    evals = [r["eval/return"] for r in result.history if "eval/return" in r and r["eval/launch_env_steps"] > 0]
    assert max(evals) >= best, evals
    assert result.eval_return >= final, (result.eval_return, evals)
    losses = [v for r in result.history for k, v in r.items() if k.startswith("loss/")]
    assert losses and all(math.isfinite(x) for x in losses)
    if result.stop_reason == "target":
        assert result.reached_target and result.eval_return >= target, result.summary()
    else:
        assert result.env_steps >= budget, result.summary()
    assert (Path(logdir) / "checkpoint.pt").exists()
