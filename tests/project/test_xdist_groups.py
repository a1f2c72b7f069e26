"""Under ``make test``'s ``-n 2 --dist loadgroup``, the tests marked ``ray`` run on one xdist worker, one after
another (tests/conftest.py), and the others spread over both workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

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
'''

INI = """[pytest]
addopts = --strict-markers
markers =
    long(reason): may take long
    slow: slow
    ray: a Ray test
    cuda: needs a GPU
"""


@pytest.mark.timeout(200)
def test_the_ray_tests_share_one_worker(tmp_path):
    pytest.importorskip("xdist", reason="needs the test extra's pytest-xdist")
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "test_generated.py").write_text(TESTS)
    (tmp_path / "log").mkdir()
    env = {**os.environ, "WORKERS_LOG": str(tmp_path / "log"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadgroup", "-q", "test_generated.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    workers = {p.name: p.read_text() for p in (tmp_path / "log").iterdir()}
    assert len(workers) == 12, workers
    assert len({workers[f"ray{k}"] for k in range(4)}) == 1, workers
    assert {workers[f"other{k}"] for k in range(8)} | {workers["ray0"]} == {"gw0", "gw1"}, workers
