"""Every tutorial runs to the end, small, as a script; the learning claims that need the full size are checked at
that size.

Each ``tutorials/NN_*.py`` states its claims as asserts, so exit code 0 means they all held. The
tutorials are collected by pattern: a new one is tested without touching this file, in a fresh interpreter of its
own. Those that start no process (``IN_PROCESS``) run as ``__main__`` in the test's process instead, where a fresh
interpreter would spend 2-3 CPU s importing torch to run the same code. A tutorial that needs an
optional extra (``EXTRAS``) is skipped, naming the extra, when its packages are not installed. A claim that only
holds past the small run's budget (PPO on Pendulum at 100k steps, ...) is a learning test below: it
calls the tutorial's own function at the full budget and asserts the claim the tutorial states. Tutorial 10's
recurrent A2C claim is checked by ``tests/algos/test_recurrent.py``, whose learning test is that tutorial's LSTM run.
"""

from __future__ import annotations

import functools
import importlib.util
import multiprocessing.process
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import torch_threads, wall_limit

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


# The tutorials whose run may take more than the 30 CPU seconds a test is allowed (tests/conftest.py), and why.
LONG = {
    "11_simulators_from_the_ecosystem": "engines' first calls, costs the small size does not shrink: JAX's import "
                                        "and jit (gymnax), ale-py's Atari, mujoco-torch's Hopper (its build and an "
                                        "eager step); then PPO for 10k env steps on gymnax",
    "12_write_your_own_algorithm": "its learning claims are set where they were measured over seeds: a hand-written "
                                   "A2C in 30k env steps of CartPole (two workers) and 100k of MinAtar Breakout (its "
                                   "envs in the tutorial's process at this size), then the same learner through the "
                                   "harness's commands (train 20k env steps, eval, compare, a 2-trial sweep), each a "
                                   "fresh process",
}
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


def run_in_process(path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs ``path`` as ``python path`` would (``__main__``, its folder first on ``sys.path``) in this process, at the
    tests' size and with one torch thread, as the fresh interpreters run; what it printed. This process's torch
    threads, torch's generator and environment are restored after it; starting a process fails it."""
    monkeypatch.setenv("RLSTRUCT_TUTORIAL_SCALE", SCALE)
    monkeypatch.delenv("RLSTRUCT_CHECK_DEVICE", raising=False)
    monkeypatch.syspath_prepend(str(path.parent))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse_a_process)
    environ = dict(os.environ)
    capsys.readouterr()
    try:
        # torch's generator as the tests left it (a fresh interpreter seeds it at random): restored after
        with torch_threads(1), torch.random.fork_rng(devices=[]):
            runpy.run_path(str(path), run_name="__main__")
    finally:
        for name in set(os.environ) - set(environ):  # what the tutorial set (a dataset folder, a check's switch)
            del os.environ[name]
        os.environ.update(environ)
    return capsys.readouterr().out


@pytest.mark.slow  # each tutorial trains: 3-14 s at the small size
@pytest.mark.parametrize("path", [pytest.param(p, marks=[pytest.mark.long(reason=LONG[p.stem]),
                                                         pytest.mark.timeout(long_timeout(p.stem) + 20)]
                                               if p.stem in LONG else []) for p in TUTORIALS],
                         ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path: Path, capsys, monkeypatch):
    skip_without_extras(path.stem)
    if path.stem in IN_PROCESS:
        out = run_in_process(path, capsys, monkeypatch)
        assert "all claims hold" in out, out[-4000:]
        return
    # One OpenMP thread, as the suite's training runs have (their config's torch_threads): with torch's default, a
    # process that evaluates a small model on a busy 2-core machine spins its second thread (tutorial 12's
    # `rlstruct eval` of 32 CartPole episodes: 10.9 CPU s, 3.7 with one).
    env = {**os.environ, "RLSTRUCT_TUTORIAL_SCALE": SCALE, "OMP_NUM_THREADS": "1"}
    env.pop("RLSTRUCT_CHECK_DEVICE", None)
    timeout = wall_limit(long_timeout(path.stem) if path.stem in LONG else TIMEOUT_S)
    try:
        proc = subprocess.run(
            [sys.executable, str(path.relative_to(ROOT))],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        out = "\n".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (e.stdout, e.stderr) if x)
        pytest.fail(f"{path.name} did not finish within {timeout:.0f} s; output so far:\n{out[-4000:]}")
    output = f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"{path.name} exited with {proc.returncode}\n{output}"
    assert "all claims hold" in proc.stdout


def test_a_tutorial_with_a_missing_extra_is_skipped_naming_it(monkeypatch):
    # An extra and a module no install has, so that the message is the same whatever extras this venv holds.
    monkeypatch.setitem(EXTRAS, "11_simulators_from_the_ecosystem", {"no_such_extra": ("no_such_module_rlstruct",)})
    pattern = r"needs the extras no_such_extra \(no_such_module_rlstruct\): pip install 'rlstruct\[no_such_extra\]'"
    with pytest.raises(pytest.skip.Exception, match=pattern):
        skip_without_extras("11_simulators_from_the_ecosystem")
    assert missing_extras("01_data_structures") == []


# The learning claims, at the tutorials' full size (scale 1). Budgets are env steps; each run takes about 15-60 s on
# 2 CPU cores.


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tutorial_09_ppo_learns_pendulum_in_100k_steps():
    """A random policy scores about -1200. Seeds 0-9 (benchmarks/thresholds.py tutorial-09-ppo) ended the 100k env
    steps at -232.1 to -135.3 with 1 torch thread (seed 0: -155.2) and -243.2 to -134.3 with 2 (seed 0: -155.5); the
    threshold (-300) is 23% under the lowest."""
    assert tutorial("09_ppo_continuous").train_ppo(100_000) > -300


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tutorial_09_normalised_ppo_learns_pendulum_in_60k_steps():
    """Seeds 0-9 (benchmarks/thresholds.py tutorial-09-normalised) ended the 60k env steps at -343.0 to -167.1 with 1
    torch thread (seed 0: -311.6) and -430.0 to -166.7 with 2 (seed 0: -292.2): seed 8 with 2 threads failed the
    former -400. The threshold (-560) is 30% under the lowest, still less than half a random policy's -1200."""
    assert tutorial("09_ppo_continuous").normalised_ppo(60_000) > -560


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tutorial_11_ppo_learns_cartpole_on_gymnax_in_100k_steps():
    """Seeds 0-9 (benchmarks/thresholds.py tutorial-11-gymnax) all stopped at a confirmed 475: with 1 torch thread at
    18k-84k env steps, reporting 486.2-500, with 2 at 27k-59k, reporting 489.7-500. The threshold (400) is 18% under
    the lowest, and the 100k budget 19% over the latest stop."""
    skip_without_extras("11_simulators_from_the_ecosystem")
    assert tutorial("11_simulators_from_the_ecosystem").train_on_gymnax(100_000) > 400
