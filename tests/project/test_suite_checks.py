"""The whole run's checks (tests/suite_checks.py): ``--leak-check`` names, kills and fails a process the run left
running, names a ``/dev/shm`` file it left behind, and names and removes what a test left in its temp folder (not a
folder that the process keeps until its exit);
``--cpu-budget`` lists the costliest tests and fails a kind of test over its budget. Each run is pytest in a
subprocess on a generated test file."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.helpers import run_generated_suite
from tests.suite_checks import BUDGETS, kind, over_budget

LEAKS = '''
import subprocess
import tempfile
import time
from pathlib import Path


def test_starts_a_process_and_leaves_it():
    pid = subprocess.Popen(["sleep", "300"], start_new_session=True).pid
    # Popen's vfork resumes this process while the child's exec is under way, before its environment (the session's
    # mark, which the check reads) is in place: under load the check could scan in that window, and a leak that
    # lasted would be caught by the next scan, which this one-second grace does not leave room for.
    while not Path(f"/proc/{{pid}}/environ").read_bytes():
        time.sleep(0.01)
    Path("pid").write_text(str(pid))


def test_leaves_a_shared_memory_file():
    Path("/dev/shm/{name}").write_bytes(b"x")


def test_leaves_a_temp_folder():
    left = tempfile.mkdtemp(prefix="left-")
    Path("temp").write_text(left)
    with tempfile.TemporaryDirectory():  # removed as it should be: not a leftover
        pass
'''

CLEAN = '''
import subprocess
import tempfile

from pathlib import Path

#: a folder for this process's lifetime, removed at its exit (as wandb keeps its staging folders from its import on)
KEPT = tempfile.TemporaryDirectory("-kept")


def test_starts_a_process_and_waits_for_it():
    subprocess.run(["true"], check=True)
    Path("kept").write_text(KEPT.name)
'''


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow  # a pytest in a fresh interpreter: 3 CPU s
@pytest.mark.timeout(120)
def test_a_run_that_leaves_a_process_a_shm_file_and_a_temp_folder_fails_naming_each(tmp_path):
    name = f"rlstruct-test-{uuid.uuid4().hex}"
    try:
        # `sleep 300` outlives any grace: a second's proves what the default 20 s would, without waiting them out.
        # --time-guard-scale 1 (here and below): the CPU's calibration, a second of CPU, is not what is checked
        out = run_generated_suite(tmp_path, LEAKS.format(name=name), "-p", "tests.suite_checks", "--leak-check",
                                  "--leak-grace", "1", "--time-guard-scale", "1")
        assert out.returncode == 1, out.stdout[-3000:]
        assert "3 passed" in out.stdout
        pid = int((tmp_path / "pid").read_text())
        assert f"suite check failed: process {pid} was left running (sleep 300); killed" in out.stdout
        assert f"suite check failed: /dev/shm/{name} was left behind" in out.stdout
        # The test's temp folder was the run's own (under TMPDIR, one folder a pytest process), named with the test
        # that made it, and removed with the run's.
        left = Path((tmp_path / "temp").read_text())
        assert left.parent.name == "main" and left.parent.parent.name.startswith("rlt-"), left
        assert (f"suite check failed: the temp entry {left.name} was left behind by "
                "test_generated.py::test_leaves_a_temp_folder") in out.stdout
        assert out.stdout.count("suite check failed") == 3, out.stdout[-3000:]
        assert not left.parent.parent.exists()
        # after pytest's last line, where a log's tail shows them
        assert out.stdout.rindex("suite check failed") > out.stdout.rindex("3 passed")
        assert not _alive(pid)
    finally:
        Path(f"/dev/shm/{name}").unlink(missing_ok=True)


@pytest.mark.slow  # a pytest in a fresh interpreter: 2 CPU s
@pytest.mark.timeout(120)
def test_a_clean_run_passes_the_checks_and_lists_its_costliest_tests(tmp_path):
    out = run_generated_suite(tmp_path, CLEAN, "-p", "tests.suite_checks", "--leak-check", "--cpu-budget",
                              "--time-guard-scale", "1")
    assert out.returncode == 0, out.stdout[-3000:]
    assert "suite check failed" not in out.stdout
    assert "CPU budget (tests/suite_checks.py)" in out.stdout
    assert "quick  test_generated.py::test_starts_a_process_and_waits_for_it" in out.stdout
    kept = Path((tmp_path / "kept").read_text())  # the run's temp folder, not named: removed as at the exit
    assert kept.parent.name == "main" and not kept.parent.parent.exists(), kept


def test_a_kind_over_its_budget_is_one_line():
    costs = [(BUDGETS["slow"] * 0.75, "slow", "a"), (BUDGETS["slow"] * 0.5, "slow", "b"), (1.0, "quick", "c")]
    assert over_budget(costs, 1.0) == [f"slow tests took {BUDGETS['slow'] * 1.25:.0f} CPU s, over their budget of "
                                       f"{BUDGETS['slow']:.0f}"]
    assert over_budget(costs, 2.0) == []  # a slower CPU's budget is scaled as the time guard's limits are


@pytest.mark.parametrize(("keywords", "expected"), [({"ray": 1, "slow": 1}, "ray"), ({"long": 1, "slow": 1}, "long"),
                                                     ({"slow": 1}, "slow"), ({}, "quick")])
def test_each_test_counts_toward_one_kind(keywords, expected):
    assert kind(keywords) == expected
