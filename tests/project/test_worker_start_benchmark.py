"""benchmarks/worker_start.py measures what it says: each of rlstruct's two start methods, in a fresh process as the
script runs it, starts its workers twice and reports both starts and the CPU seconds of every process involved."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork server", "spawn"])
def test_one_configuration_reports_both_starts_and_their_cpu_seconds(method):
    name = f"rlstruct {method}, 1 workers"
    out = subprocess.run([sys.executable, "benchmarks/worker_start.py", "--one", name, "--workers", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(result) == {"first_s", "again_s", "cpu_s"} and all(v > 0 for v in result.values()), result
