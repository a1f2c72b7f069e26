"""Under ``make test``'s ``-n 2 --dist loadgroup``, the tests marked ``ray`` run on one xdist worker, one after
another, the users of a module-scoped fixture run on one worker, which builds the fixture once (tests/conftest.py),
and the others spread over both workers."""

from __future__ import annotations

import pytest

from tests.helpers import run_generated_suite

TESTS = '''
import os
import time

import pytest


def record(name):
    with open(os.path.join(os.environ["WORKERS_LOG"], name), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])


@pytest.mark.ray
@pytest.mark.parametrize("k", range(4))
def test_ray(k):
    record(f"ray{k}")
    time.sleep(0.3)


@pytest.mark.parametrize("k", range(8))
def test_other(k):
    record(f"other{k}")
    time.sleep(0.3)


@pytest.fixture(scope="module")
def built():
    record(f"built-{os.environ['PYTEST_XDIST_WORKER']}")


@pytest.mark.parametrize("k", range(4))
def test_user(k, built):
    record(f"user{k}")
    time.sleep(0.3)


@pytest.mark.ray
def test_ray_user(built):
    record("ray4")
'''

@pytest.mark.timeout(200)
@pytest.mark.slow
def test_the_ray_tests_share_one_worker_and_a_module_fixtures_users_another(tmp_path):
    pytest.importorskip("xdist", reason="needs the test extra's pytest-xdist")
    (tmp_path / "log").mkdir()
    # --time-guard-scale 1: no calibration in the controller and each worker (a second of CPU each), which the
    # scheduling proved here does not read
    out = run_generated_suite(tmp_path, TESTS, "-n", "2", "--dist", "loadgroup", "-q", "--time-guard-scale", "1",
                              env={"WORKERS_LOG": str(tmp_path / "log")}, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    workers = {p.name: p.read_text() for p in (tmp_path / "log").iterdir()}
    built = [name for name in workers if name.startswith("built-")]
    assert len(workers) == 17 + len(built), workers
    assert len({workers[f"ray{k}"] for k in range(5)}) == 1, workers
    assert {workers[f"other{k}"] for k in range(8)} | {workers["ray0"]} == {"gw0", "gw1"}, workers
    users = {workers[f"user{k}"] for k in range(4)}
    assert len(users) == 1 and f"built-{users.pop()}" in built, workers
