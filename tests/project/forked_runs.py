"""benchmarks/published.py's runs forked from the test's process instead of started as fresh interpreters: what the
tests of the script prove is what it does with its runs (start, kill, resume, skip, re-evaluate, read), not an
interpreter's start."""

from __future__ import annotations

import os
import subprocess
import tempfile
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import ForkedCommand

__all__ = ["ForkedPopen", "fork_the_runs", "forked_run"]


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
