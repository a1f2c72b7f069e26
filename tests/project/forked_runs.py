"""Benchmark scripts' runs forked from the test's process instead of started as fresh interpreters: what the tests of
benchmarks/published.py prove is what it does with its runs (start, kill, resume, skip, re-evaluate, read), and what
the tests of a ``benchmarks/_fresh.py`` script prove is that each configuration runs in a process of its own and the
table reports it, not an interpreter's start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import ForkedCommand

__all__ = ["ForkedPopen", "fork_the_configurations", "fork_the_runs", "forkable", "forked_run"]


def _in_environment(env: dict[str, str]) -> Callable[[], None]:
    """A :class:`ForkedCommand` seam: the child's environment becomes ``env`` (published.py gives its runs one)."""

    def seam() -> None:
        os.environ.clear()
        os.environ.update(env)

    return seam


class ForkedPopen:
    """What benchmarks/published.py uses of ``subprocess.Popen``, for its ``python -m rlstruct.algos ARGS``, run in a
    child forked from this process and started as a fresh one (``tests.helpers.ForkedCommand``) with the environment
    ``env`` published.py gives it; its output in ``folder`` (:attr:`FOLDER`), not in the run's log."""

    FOLDER: Path

    def __init__(self, args: list[str], *, stdout, stderr, env: dict[str, str]):
        assert args[1:3] == ["-m", "rlstruct.algos"], args
        output = Path(tempfile.mkdtemp(dir=self.FOLDER)) / "command"
        self._run = ForkedCommand(list(args[3:]), output, seam=_in_environment(env))
        self.pid, self.log = self._run.pid, None

    @property
    def returncode(self) -> int | None:
        return self._run.returncode

    def poll(self) -> int | None:
        return self._run.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._run.wait(600 if timeout is None else timeout)

    def send_signal(self, signum: int) -> None:
        if self._run.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self._run.kill()


def forked_run(args: list[str], *, capture_output: bool, text: bool, env: dict[str, str],
               timeout: float = 300) -> subprocess.CompletedProcess:
    """What benchmarks/published.py uses of ``subprocess.run``, for a re-evaluation (``python -m rlstruct.algos eval
    ...``, or ``python benchmarks/sb3_reference.py --reevaluate ...``: the script's ``main``), run in a child forked
    from this process and started as a fresh one with the environment ``env``, at most ``wall_limit(timeout)``
    seconds: its status and output, as text."""
    assert capture_output and text, "published.py reads a re-evaluation's output as text"
    call = None
    if args[1:3] == ["-m", "rlstruct.algos"]:
        argv = list(args[3:])
    else:
        assert Path(args[1]).name == "sb3_reference.py", args
        from benchmarks import sb3_reference

        argv = []

        def call() -> int:
            return sb3_reference.main(list(args[2:]))

    output = Path(tempfile.mkdtemp(dir=ForkedPopen.FOLDER)) / "command"
    return ForkedCommand(argv, output, seam=_in_environment(env), call=call).completed(args, timeout)


def fork_the_runs(published: types.ModuleType, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes ``published`` (benchmarks/published.py) start its training runs as :class:`ForkedPopen` children and run
    its re-evaluations through :func:`forked_run`, their output under ``folder`` (made here), while ``monkeypatch``
    holds."""
    folder.mkdir()
    monkeypatch.setattr(ForkedPopen, "FOLDER", folder, raising=False)
    monkeypatch.setattr(published, "subprocess", types.SimpleNamespace(Popen=ForkedPopen, STDOUT=subprocess.STDOUT,
                                                                       run=forked_run))


def forkable() -> bool:
    """Whether a child forked from this process starts as a fresh interpreter would: no CUDA context here (a forked
    child cannot use the GPU after it), and neither Ray (which reads its settings as it is imported) nor JAX (whose
    runtime's threads a fork does not copy) imported."""
    import torch

    return not torch.cuda.is_initialized() and "ray" not in sys.modules and "jax" not in sys.modules


def fork_the_configurations(script: types.ModuleType, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes ``benchmarks/_fresh.py`` run each configuration of ``script`` (a benchmark script's module, whose ``main``
    answers ``--one NAME``), ``python SCRIPT --one NAME ARGS`` as its ``run_one`` starts it, as ``script.main()`` under
    that ``sys.argv`` in a child forked from this process and started as a fresh one (``tests.helpers.ForkedCommand``,
    with the environment ``run_one`` is given), its output under ``folder`` (made here), while ``monkeypatch`` holds.
    A fresh interpreter would import torch and rlstruct again (2-3 CPU s) before the configuration starts; the script's
    parent still reads the child's last JSON line as ``run_one`` does. Where a child forked from here would not start
    as a fresh one would (:func:`forkable`), the configurations run in fresh interpreters as before."""
    from benchmarks import _fresh

    if not forkable():
        return
    folder.mkdir()

    def run_one(path: str, name: str, args=(), *, timeout: float = 900.0, env: dict[str, str] | None = None) -> dict:
        assert Path(path).resolve() == Path(script.__file__).resolve(), (path, script.__file__)
        argv = [str(path), "--one", name, *args]

        def call() -> int:
            if env is not None:
                _in_environment(env)()
            sys.argv = argv
            script.main()
            return 0

        output = Path(tempfile.mkdtemp(dir=folder)) / "configuration"
        done = ForkedCommand([], output, call=call).completed([sys.executable, *argv], timeout)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr[-2000:]}")
        return json.loads(lines[-1])

    monkeypatch.setattr(_fresh, "run_one", run_one)
