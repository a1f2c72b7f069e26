"""Every tutorial runs to the end, small, as a script; the learning claims that need the full size are checked at
that size.

Each ``tutorials/NN_*.py`` states its claims as asserts, so exit code 0 means they all held. The
tutorials are collected by pattern: a new one is tested without touching this file, in a fresh interpreter of its
own. Those that start no process (``IN_PROCESS``) run as ``__main__`` in the test's process instead, where a fresh
interpreter would spend 2-3 CPU s importing torch to run the same code; those of ``FORKED`` run as ``__main__`` in a
child forked from the test's process and started as a fresh one (:func:`run_forked`), their worker processes and Ray
clusters their own, their ``python -m rlstruct.algos`` commands forked in turn, each from the tutorial's folder with
``mylab`` not imported. That a command imports a run's algorithm by its recorded source in a fresh interpreter is
``tests/algos/test_outside_algorithms.py``'s claim, not a tutorial's. A tutorial that needs an
optional extra (``EXTRAS``) is skipped, naming the extra, when its packages are not installed. A claim that only
holds past the small run's budget (PPO on Pendulum at 100k steps, ...) is a learning test below: it
calls the tutorial's own function at the full budget and asserts the claim the tutorial states. A tutorial whose
full size is little more than its learning tests' runs (``FULL_SIZE``) runs at that size instead of the small one, and
its learning tests read the returns of that run, in this process, rather than train again. Tutorial 10's
recurrent A2C claim is checked by ``tests/algos/test_recurrent.py``, whose learning test is that tutorial's LSTM run.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import multiprocessing.process
import os
import re
import runpy
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import ForkedCommand, torch_threads, training_runs_with, wall_limit
from tests.project.forked_runs import forkable

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9]*.py"))
# The one size knob of every tutorial: small enough that the whole file stays well under two minutes.
SCALE = "0.1"
TIMEOUT_S = 100
#: a LONG tutorial's limit: its full-size runs on one of two busy cores
LONG_TIMEOUT_S = 280

pytestmark = pytest.mark.timeout(TIMEOUT_S + 20)

# The optional extras a tutorial needs: {tutorial stem: {extra: the modules it installs}}.
EXTRAS: dict[str, dict[str, tuple[str, ...]]] = {
    "11_simulators_from_the_ecosystem": {"atari": ("ale_py",), "jax": ("jax", "gymnax"),
                                         "mujoco": ("mujoco", "mujoco_torch")},
    "12_write_your_own_algorithm": {"sweep": ("optuna",), "stats": ("scipy",)},
    "13_record_then_learn_offline": {"datasets": ("minari", "h5py")},
}


def missing_extras(stem: str) -> list[str]:
    """The extras of ``EXTRAS[stem]`` with a module that cannot be imported, each as ``extra (module)``."""
    return [f"{extra} ({module})" for extra, modules in EXTRAS.get(stem, {}).items()
            for module in modules if importlib.util.find_spec(module) is None]


def skip_without_extras(stem: str) -> None:
    missing = missing_extras(stem)
    if missing:
        pytest.skip(f"{stem} needs the extras {', '.join(missing)}: pip install 'rlstruct[{','.join(EXTRAS[stem])}]'")


@functools.cache
def tutorial(stem: str):
    """The tutorial ``tutorials/{stem}.py`` imported as a module (its ``main`` does not run), at scale 1."""
    spec = importlib.util.spec_from_file_location(f"tutorial_{stem}", ROOT / "tutorials" / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tutorials_are_numbered_in_order():
    numbers = [p.name.split("_", 1)[0] for p in TUTORIALS]
    assert numbers, "no tutorial found"
    assert numbers == sorted(set(numbers)), f"tutorial numbers must be distinct: {numbers}"


def test_readme_links_every_tutorial_in_order():
    text = (ROOT / "README.md").read_text()
    positions = [text.find(f"tutorials/{p.name}") for p in TUTORIALS]
    missing = [p.name for p, i in zip(TUTORIALS, positions) if i < 0]
    assert not missing, f"README.md does not link {missing}"
    assert positions == sorted(positions), "README.md must list the tutorials in order"


# The tutorials that run at their full size (scale 1, as a reader runs them) instead of the small one, and why: their
# learning tests' runs are most of that size, so that the small run would be a second, weaker proof of the same
# claims. The learning tests (below) read the returns of this run where it ran in this process before them (one_worker),
# and train on their own where it did not (run alone, or benchmarks/thresholds.py).
FULL_SIZE = {
    "09_ppo_continuous": "parts 4 and 5 are the two learning tests' runs (PPO on Pendulum for 100k env steps, the "
                         "normalised one for 60k); the small size trained 40k and 8k more",
    "11_simulators_from_the_ecosystem": "part 6 is the learning test's run (PPO on gymnax's CartPole until a "
                                        "confirmed 475, within 100k env steps); the small size trained 10k more",
}

# The tutorials whose run may take more than the 30 CPU seconds a test is allowed (tests/conftest.py), and why.
LONG = {
    "09_ppo_continuous": "its full size (FULL_SIZE): PPO on Pendulum for 100k env steps and the normalised one for 60k",
    "11_simulators_from_the_ecosystem": "engines' first calls, costs the small size does not shrink: JAX's import "
                                        "and jit (gymnax), ale-py's Atari, mujoco-torch's Hopper (its build and an "
                                        "eager step); then PPO on gymnax at its full size (FULL_SIZE)",
    "12_write_your_own_algorithm": "its learning claims are set where they were measured over seeds: a hand-written "
                                   "A2C in 30k env steps of CartPole (two workers) and 100k of MinAtar Breakout (its "
                                   "envs in the tutorial's process at this size), then the same learner through the "
                                   "harness's commands (train 20k env steps, eval, compare, a 2-trial sweep), each a "
                                   "process of its own",
}
#: what a local Ray cluster keeps in its temp folder after it ended: its sessions' logs
RAY_LOGS = "ray"
#: a LONG tutorial's own limit where its runs take more than :data:`LONG_TIMEOUT_S`
LONG_TIMEOUTS_S = {"12_write_your_own_algorithm": 600}


def long_timeout(stem: str) -> int:
    """The time limit of the LONG tutorial ``stem``."""
    return LONG_TIMEOUTS_S.get(stem, LONG_TIMEOUT_S)


# The tutorials that start no process (no batcher worker, no Ray actor, no command): each runs as ``__main__`` in the
# test's process (run_in_process), the others in a fresh interpreter, as a reader runs them. A new tutorial runs in a
# fresh one until it is named here.
IN_PROCESS = frozenset({"01_data_structures", "02_environments", "03_agents_and_check_device", "06_a2c", "07_dqn",
                        "09_ppo_continuous", "10_pixels_and_recurrent", "13_record_then_learn_offline"})


def _refuse_a_process(process) -> None:
    raise AssertionError(f"a tutorial of IN_PROCESS started the process {process.name}: its workers would come from "
                         "the test's process; take it out of IN_PROCESS (tests/project/test_tutorials.py)")


def run_in_process(path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, scale: str,
                   results: list | None = None) -> str:
    """Runs ``path`` as ``python path`` would (``__main__``, its folder first on ``sys.path``) in this process, at
    ``scale`` and with one torch thread, as the fresh interpreters run; what it printed. Its training runs' results
    are appended to ``results`` when given. This process's torch threads, torch's generator and environment are
    restored after it; starting a process fails it."""
    monkeypatch.setenv("RLSTRUCT_TUTORIAL_SCALE", scale)
    monkeypatch.delenv("RLSTRUCT_CHECK_DEVICE", raising=False)
    monkeypatch.syspath_prepend(str(path.parent))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse_a_process)
    environ = dict(os.environ)
    capsys.readouterr()
    try:
        # torch's generator as the tests left it (a fresh interpreter seeds it at random): restored after
        with torch_threads(1), torch.random.fork_rng(devices=[]), training_runs_with(results=results):
            runpy.run_path(str(path), run_name="__main__")
    finally:
        for name in set(os.environ) - set(environ):  # what the tutorial set (a dataset folder, a check's switch)
            del os.environ[name]
        os.environ.update(environ)
    return capsys.readouterr().out


# The tutorials that start processes (batcher workers, `rlstruct` commands, a Ray cluster): each runs in a child
# forked from the test's process (run_forked), which spends no seconds importing torch again, nor do its commands;
# in a fresh interpreter where the test's process holds what a fork cannot take along (forkable).
FORKED = frozenset({"04_batchers", "05_reinforce_on_devices", "08_scaling", "11_simulators_from_the_ecosystem",
                    "12_write_your_own_algorithm", "14_asynchronous_learning"})


@functools.cache
def fresh_sys_path() -> tuple[str, ...]:
    """``sys.path`` after its first entry in a fresh interpreter of this venv: what a script searches besides its
    own folder (pytest's own additions, the repository's root among them, are not in it)."""
    done = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                          capture_output=True, text=True, check=True, timeout=wall_limit(60))
    return tuple(json.loads(done.stdout))


def _as_a_script(folder: Path) -> None:
    """In a forked child: ``sys.path`` as a script in ``folder`` (or ``python -m`` run from it) starts with, and no
    module of ``tutorials/mylab`` imported, so that a command imports the run's algorithm as a fresh one would."""
    sys.path[:] = [str(folder), *fresh_sys_path()]
    for name in [name for name in sys.modules if name == "mylab" or name.startswith("mylab.")]:
        del sys.modules[name]


def _forked_commands(real_run, folder: Path):
    """``subprocess.run`` for a forked tutorial: ``[sys.executable, "-m", "rlstruct.algos", *ARGS]`` (with ``cwd``,
    ``capture_output`` and ``text``) runs as a :class:`ForkedCommand` started in ``cwd`` as ``python -m`` would be,
    its output under ``folder``; any other call is ``real_run``'s."""

    def run(args, **kwargs):
        if list(args[:3]) != [sys.executable, "-m", "rlstruct.algos"] or set(kwargs) - {"cwd", "capture_output",
                                                                                        "text"}:
            return real_run(args, **kwargs)
        cwd = Path(kwargs.get("cwd") or os.getcwd()).resolve()

        def from_cwd() -> None:
            from rlstruct.algos import __main__ as module

            os.chdir(cwd)
            _as_a_script(cwd)
            sys.argv = [module.__file__, *args[3:]]

        command = ForkedCommand(list(args[3:]), Path(tempfile.mkdtemp(dir=folder)) / "command", seam=from_cwd)
        done = command.completed(args, TIMEOUT_S)
        if not kwargs.get("text"):
            done.stdout, done.stderr = done.stdout.encode(), done.stderr.encode()
        return done

    return run


def run_forked(path: Path, folder: Path, timeout: float, scale: str, temp: str) -> subprocess.CompletedProcess:
    """Runs ``path`` as ``python path`` would, from the repository's root, at ``scale`` with one OpenMP
    thread and ``temp`` as its temp folder, in a child forked from this process and started as a fresh one
    (:class:`ForkedCommand`): ``__main__`` (which its spawned workers import again), its folder first on a fresh
    interpreter's ``sys.path``. Its ``python -m rlstruct.algos`` commands are forked from it in turn
    (:func:`_forked_commands`). Waits at most ``wall_limit(timeout)``; its status and what it printed."""
    fresh_sys_path()  # asked here, once a worker: not in every child

    def script() -> int:
        os.chdir(ROOT)
        os.environ.update({"RLSTRUCT_TUTORIAL_SCALE": scale, "OMP_NUM_THREADS": "1"})
        os.environ.pop("RLSTRUCT_CHECK_DEVICE", None)
        torch.set_num_threads(1)  # what OMP_NUM_THREADS=1 gives an interpreter that starts with it
        _as_a_script(path.parent)
        sys.argv = [str(path.relative_to(ROOT))]
        subprocess.run = _forked_commands(subprocess.run, folder)
        runpy.run_path(str(path), run_name="__main__")
        return 0

    child = ForkedCommand([], folder / "tutorial", call=script, temp=temp)
    try:
        return child.completed([sys.executable, str(path)], timeout)
    except AssertionError:  # killed at the limit
        pytest.fail(f"{path.name} did not finish within {wall_limit(timeout):.0f} s; output so far:\n"
                    f"{child.stdout[-4000:]}\n{child.stderr[-4000:]}")


#: {FULL_SIZE tutorial: the returns of its training runs in order} of the full-size runs that passed in this process
_FULL_SIZE_RETURNS: dict[str, list[float]] = {}
#: what a forked or fresh FULL_SIZE tutorial prints of each training run's return (to 0.1: a printed value above a
#: threshold of one decimal is above it whatever the rounding cut)
_PRINTED_RETURN = {"11_simulators_from_the_ecosystem": re.compile(r"greedy evaluation return (-?\d+\.\d) after")}


def tutorial_params(full_size: bool) -> list:
    """The tutorials of FULL_SIZE (``full_size``) or the others, each with its LONG marks."""
    return [pytest.param(p, id=p.stem, marks=[pytest.mark.long(reason=LONG[p.stem]),
                                              pytest.mark.timeout(long_timeout(p.stem) + 20)] if p.stem in LONG else [])
            for p in TUTORIALS if (p.stem in FULL_SIZE) == full_size]


@pytest.fixture(scope="module")
def one_worker() -> None:
    """Nothing: a module-scoped fixture's users run on one xdist worker, in this file's order (tests/conftest.py), so
    that the learning tests of a FULL_SIZE tutorial follow its run in its process."""


@pytest.mark.slow  # each tutorial trains: 3-14 s at the small size
@pytest.mark.parametrize("path", tutorial_params(full_size=False))
def test_tutorial_runs(path: Path, capsys, monkeypatch, tmp_path):
    run_tutorial(path, capsys, monkeypatch, tmp_path)


@pytest.mark.slow
@pytest.mark.usefixtures("one_worker")
@pytest.mark.parametrize("path", tutorial_params(full_size=True))
def test_tutorial_runs_at_full_size(path: Path, capsys, monkeypatch, tmp_path):
    run_tutorial(path, capsys, monkeypatch, tmp_path)


def run_tutorial(path: Path, capsys, monkeypatch, tmp_path) -> None:
    """Runs the tutorial ``path`` as a script (in this process, forked or fresh) and checks that its claims held; a
    FULL_SIZE one at scale 1, its training runs' returns kept for its learning tests."""
    skip_without_extras(path.stem)
    scale = "1" if path.stem in FULL_SIZE else SCALE
    if path.stem in IN_PROCESS:
        results = []
        out = run_in_process(path, capsys, monkeypatch, scale, results)
        assert "all claims hold" in out, out[-4000:]
        if path.stem in FULL_SIZE:
            _FULL_SIZE_RETURNS[path.stem] = [r.eval_return for r in results]
        return
    limit = long_timeout(path.stem) if path.stem in LONG else TIMEOUT_S
    # The tutorial's temp folder (TMPDIR) is the test's, removed after it, where a local Ray cluster's session logs
    # (which Ray keeps, as it would in a user's temp folder) go; anything else left there is the tutorial's leak. A
    # short name: a Ray node's sockets live under it, within AF_UNIX's 107 bytes.
    with tempfile.TemporaryDirectory(prefix="t", ignore_cleanup_errors=True) as temp:
        if path.stem in FORKED and forkable():
            proc = run_forked(path, tmp_path, limit, scale, temp)
        else:
            # One that runs commands (it imports subprocess) forks them from its fresh interpreter, as run_forked
            # does.
            commands = path.stem in FORKED and "import subprocess" in path.read_text()
            proc = run_fresh(path, limit, scale, temp, tmp_path if commands else None)
        left = sorted(set(os.listdir(temp)) - {RAY_LOGS})
    output = f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"{path.name} exited with {proc.returncode}\n{output}"
    assert "all claims hold" in proc.stdout
    assert not left, f"{path.name} left {left} in its temp folder"
    if path.stem in FULL_SIZE:
        _FULL_SIZE_RETURNS[path.stem] = [float(v) for v in _PRINTED_RETURN[path.stem].findall(proc.stdout)]


def full_size_return(stem: str, index: int, train: Callable[[Any], float]) -> float:
    """The return of training run ``index`` of the FULL_SIZE tutorial ``stem``'s run in this process, else
    ``train(tutorial(stem))``'s: the same run (the tutorial's function at its full size, seed 0, one torch thread
    there; the thresholds were measured with one and two)."""
    returns = _FULL_SIZE_RETURNS.get(stem)
    return returns[index] if returns is not None else train(tutorial(stem))


#: ``python -c`` for a FORKED tutorial that cannot be forked (run_fresh): ``sys.argv[1:]`` is the repository's root,
#: the tutorial, the folder of its commands' output and this process's ``WALL_SCALE``
_FRESH_WITH_FORKED_COMMANDS = ("import sys; from pathlib import Path; fresh = sys.path[1:]; "
                               "sys.path.insert(0, sys.argv[1]); from tests.project import test_tutorials as t; "
                               "t.main_with_forked_commands(Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4]), "
                               "fresh)")


def main_with_forked_commands(path: Path, folder: Path, wall_scale: float, fresh: list[str]) -> None:
    """In the fresh interpreter of a FORKED tutorial (run_fresh): runs ``path`` as ``__main__``, as ``python path``
    would (its folder first on ``sys.path``, then the interpreter's own entries ``fresh``), its ``python -m
    rlstruct.algos`` commands forked from it (:func:`_forked_commands`) rather than each a fresh interpreter."""
    from tests import helpers

    helpers.WALL_SCALE = wall_scale
    sys.path[:] = [str(path.parent), *fresh]
    fresh_sys_path()  # asked once here, not in every command
    sys.argv = [str(path.relative_to(ROOT))]
    subprocess.run = _forked_commands(subprocess.run, folder)
    runpy.run_path(str(path), run_name="__main__")


def run_fresh(path: Path, limit: float, scale: str, temp: str, folder: Path | None = None
              ) -> subprocess.CompletedProcess:
    """Runs ``python path`` from the repository's root at ``scale`` with ``temp`` as its temp folder, at most
    ``wall_limit(limit)``; with ``folder`` (a FORKED tutorial), through :func:`main_with_forked_commands`, its
    commands' output there."""
    # One OpenMP thread, as the suite's training runs have (their config's torch_threads): with torch's default, a
    # process that evaluates a small model on a busy 2-core machine spins its second thread (tutorial 12's
    # `rlstruct eval` of 32 CartPole episodes: 10.9 CPU s, 3.7 with one).
    env = {**os.environ, "RLSTRUCT_TUTORIAL_SCALE": scale, "OMP_NUM_THREADS": "1", "TMPDIR": temp}
    env.pop("RLSTRUCT_CHECK_DEVICE", None)
    timeout = wall_limit(limit)
    from tests import helpers

    args = [sys.executable, str(path.relative_to(ROOT))] if folder is None else [
        sys.executable, "-c", _FRESH_WITH_FORKED_COMMANDS, str(ROOT), str(path), str(folder), str(helpers.WALL_SCALE)]
    try:
        return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = "\n".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (e.stdout, e.stderr) if x)
        pytest.fail(f"{path.name} did not finish within {timeout:.0f} s; output so far:\n{out[-4000:]}")


def test_a_tutorial_with_a_missing_extra_is_skipped_naming_it(monkeypatch):
    # An extra and a module no install has, so that the message is the same whatever extras this venv holds.
    monkeypatch.setitem(EXTRAS, "11_simulators_from_the_ecosystem", {"no_such_extra": ("no_such_module_rlstruct",)})
    pattern = r"needs the extras no_such_extra \(no_such_module_rlstruct\): pip install 'rlstruct\[no_such_extra\]'"
    with pytest.raises(pytest.skip.Exception, match=pattern):
        skip_without_extras("11_simulators_from_the_ecosystem")
    assert missing_extras("01_data_structures") == []


# The learning claims, at the tutorials' full size (scale 1). Budgets are env steps; each run takes about 15-60 s on
# 2 CPU cores. Those of a FULL_SIZE tutorial read its run's returns (full_size_return).


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("one_worker")
def test_tutorial_09_ppo_learns_pendulum_in_100k_steps():
    """A random policy scores about -1200. Seeds 0-9 (benchmarks/thresholds.py tutorial-09-ppo) ended the 100k env
    steps at -232.1 to -135.3 with 1 torch thread (seed 0: -155.2) and -243.2 to -134.3 with 2 (seed 0: -155.5); the
    threshold (-300) is 23% under the lowest."""
    assert full_size_return("09_ppo_continuous", 0, lambda t: t.train_ppo(100_000)) > -300


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("one_worker")
def test_tutorial_09_normalised_ppo_learns_pendulum_in_60k_steps():
    """Seeds 0-9 (benchmarks/thresholds.py tutorial-09-normalised) ended the 60k env steps at -343.0 to -167.1 with 1
    torch thread (seed 0: -311.6) and -430.0 to -166.7 with 2 (seed 0: -292.2): seed 8 with 2 threads failed the
    former -400. The threshold (-560) is 30% under the lowest, still less than half a random policy's -1200."""
    assert full_size_return("09_ppo_continuous", 1, lambda t: t.normalised_ppo(60_000)) > -560


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("one_worker")
def test_tutorial_11_ppo_learns_cartpole_on_gymnax_in_100k_steps():
    """Seeds 0-9 (benchmarks/thresholds.py tutorial-11-gymnax) all stopped at a confirmed 475: with 1 torch thread at
    18k-84k env steps, reporting 486.2-500, with 2 at 27k-59k, reporting 489.7-500. The threshold (400) is 18% under
    the lowest, and the 100k budget 19% over the latest stop."""
    skip_without_extras("11_simulators_from_the_ecosystem")
    assert full_size_return("11_simulators_from_the_ecosystem", 0, lambda t: t.train_on_gymnax(100_000)) > 400
