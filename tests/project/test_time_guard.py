"""The suite's time guard (tests/conftest.py): a test over the CPU-time limit fails unless marked ``long`` with a
reason, and one over the quick limit unless marked ``slow``; waiting does not count; a ``long`` marker without a
reason stops the session before any test runs; a ``long`` test counts as ``slow`` (``make quick`` leaves it out).

Each check runs pytest in a subprocess on a generated test file, with the suite's conftest as a plugin and a limit of
0.125 CPU seconds (0.05 outside ``slow``) scaled by 2; the tests that must exceed it spin until the process (or a
batcher's worker process) has used 0.35-0.4 CPU seconds, so the verdicts do not depend on the machine's speed or load
(a test's own overhead around its spin is 0.01-0.02 CPU s).
"""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.helpers import run_generated_suite

TESTS = '''
import time

import pytest

from rlstruct.batchers import RL_Batcher
from tests.fakes import ConstantAgent, CountingEnv
from tests.helpers import run_generated_suite


def spin(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass


def test_quick():
    pass


def test_spins():
    spin(0.4)


@pytest.mark.long(reason="spins on purpose")
def test_spins_marked_long(request):
    assert request.node.get_closest_marker("slow"), "a long test is a slow one: -m 'not slow' leaves it out"
    spin(0.35)


def test_sleeps():
    time.sleep(1.0)


@pytest.fixture
def slow_fixture():
    spin(0.35)


def test_with_a_slow_fixture(slow_fixture):
    pass


def test_fails_by_itself():
    assert False, "its own failure"


class SpinningAgent(ConstantAgent):
    def __call__(self, state, observation, agent_info, history=None):
        spin(0.35)
        return super().__call__(state, observation, agent_info, history)


def test_spins_a_little():
    spin(0.15)


@pytest.mark.slow
def test_spins_a_little_marked_slow():
    spin(0.15)


def test_spins_under_the_scaled_quick_limit():
    spin(0.065)  # over the 0.05 s limit as written, under the 0.1 s it is scaled to: room for the test's own overhead


@pytest.mark.compiles
def test_compiles(request):
    assert request.node.get_closest_marker("slow"), "a compiling test is a slow one: -m 'not slow' leaves it out"


@pytest.fixture(scope="module")
def shared_fixture():
    spin(0.15)


def test_with_a_shared_fixture(shared_fixture):
    pass


@pytest.fixture
def own_fixture():
    spin(0.15)


def test_with_its_own_fixture(own_fixture):
    pass


def test_spins_in_a_worker_process():
    with RL_Batcher(1, SpinningAgent, {}, CountingEnv, {"n_envs": 1, "autoreset": True}, 1, [0]) as batcher:
        batcher.reset()
        batcher.execute()
        batcher.get()
'''

def run_pytest(folder: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    # The guard's plugin alone: none of the installed ones that these tests do not use (xdist, anyio, hypothesis).
    return run_generated_suite(folder, source, "-p", "no:xdist", "-p", "no:anyio", "-p", "no:hypothesispytest",
                               "--max-test-seconds", "0.125", "--max-quick-seconds", "0.05", "--time-guard-scale", "2",
                               "--junitxml", "report.xml", "-q", *args)


def outcomes(report: Path) -> dict[str, str]:
    """``{test name: "passed" | "failed" | "error"}`` from a JUnit XML report, with each failure's message."""
    found = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        found[case.get("name")] = "passed" if bad is None else f"{bad.tag}: {bad.get('message')} {bad.text}"
    return found


@pytest.mark.timeout(110)
@pytest.mark.slow
def test_a_test_over_the_limit_fails_unless_marked_long_and_the_limits_scale_with_the_cpu(tmp_path):
    """One pytest run (a fresh interpreter that imports torch: 3-5 CPU s) checks every verdict of the guard, at limits
    of 0.125 and 0.05 CPU s scaled by 2 (``--time-guard-scale 2``, which the header says): 0.065 CPU s is under the
    0.1 s that the quick limit becomes, and the long and the compiling tests carry the ``slow`` marker that ``make
    quick``'s ``-m "not slow"`` deselects by (each asserts it of itself; the guard's collection hook adds it before
    pytest's own deselection runs, as the conftest's hooks run before pytest's built-in ones)."""
    out = run_pytest(tmp_path, TESTS, "-v")  # -v: the header
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "time guard: 0.125 CPU s a test, 0.05 outside `slow`, x 2.00 on this CPU" in out.stdout
    got = outcomes(tmp_path / "report.xml")
    assert got["test_quick"] == got["test_spins_marked_long"] == got["test_sleeps"] == "passed", got
    assert got["test_compiles"] == got["test_spins_under_the_scaled_quick_limit"] == "passed", got
    assert got["test_spins"].startswith("failure"), got
    assert "test_generated.py::test_spins took 0.4" in got["test_spins"]
    assert "s of CPU time" in got["test_spins"] and "more than the 0.25 s a test may take" in got["test_spins"]
    assert "@pytest.mark.long(reason='...')" in got["test_spins"]
    # A fixture's time counts: the test fails at its setup, before its body runs.
    assert got["test_with_a_slow_fixture"].startswith("error") and "up to its setup" in \
        got["test_with_a_slow_fixture"], got
    # A worker's CPU time counts: the fork server's child, not the test process's, it is counted through the server.
    assert "test_generated.py::test_spins_in_a_worker_process took" in got["test_spins_in_a_worker_process"], got
    # A test outside `slow` is held to the quick limit (0.1 s here): `make quick` runs it.
    assert got["test_spins_a_little"].startswith("failure") and "more than the 0.1 s a test outside `slow` may " \
        "take" in got["test_spins_a_little"] and "@pytest.mark.slow" in got["test_spins_a_little"], got
    assert got["test_spins_a_little_marked_slow"] == "passed", got
    # A shared fixture's setup is paid once, by the first test that uses it: not held to that test's quick limit. A
    # test's own fixture is.
    assert got["test_with_a_shared_fixture"] == "passed", got
    assert got["test_with_its_own_fixture"].startswith("error") and "outside `slow`" in \
        got["test_with_its_own_fixture"], got
    # A test that fails by itself keeps its own failure.
    assert "its own failure" in got["test_fails_by_itself"] and "CPU time" not in got["test_fails_by_itself"]


def test_the_calibration_never_tightens_the_limits(monkeypatch):
    import tests.conftest as guard

    class Config:
        def __init__(self):
            self.stash = pytest.Stash()

        def getoption(self, name):
            return None

    for seconds, scale in ((guard.REFERENCE_CALIBRATION_SECONDS / 2, 1.0),
                           (guard.REFERENCE_CALIBRATION_SECONDS * 2, 2.0)):
        monkeypatch.setattr(guard, "_calibration_seconds", lambda seconds=seconds: seconds)
        assert guard._guard_scale(Config()) == pytest.approx(scale)


def test_a_long_marker_without_a_reason_stops_the_session():
    """The collection hook raises pytest's UsageError, with which pytest ends the session before any test runs (exit
    status 4, its documented USAGE_ERROR), naming the test and what the marker needs."""
    import tests.conftest as guard

    class Item(_Marked):
        nodeid = "test_generated.py::test_x"

        def add_marker(self, marker) -> None:
            pass

    with pytest.raises(pytest.UsageError, match=r"^test_generated\.py::test_x: @pytest\.mark\.long needs "
                                                 r"reason='why this test may take more than 30 s'$"):
        guard.pytest_collection_modifyitems(None, [Item("long")])


class _Marked:
    """What the guard reads of a test item: its markers."""

    def __init__(self, *names: str):
        self.names = names

    def get_closest_marker(self, name: str):
        return pytest.Mark(name, (), {}) if name in self.names else None


@pytest.mark.parametrize("marks, held", [((), True), (("slow",), False), (("cuda",), False), (("cuda", "slow"), False)])
def test_the_quick_limit_holds_for_tests_neither_slow_nor_cuda(marks, held):
    # A cuda test is skipped on a CPU machine; on a GPU, the CUDA context and the compilers take its CPU seconds.
    from tests.conftest import _held_to_quick_limit

    assert _held_to_quick_limit(_Marked(*marks)) is held
