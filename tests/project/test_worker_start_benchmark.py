"""benchmarks/worker_start.py measures what it says: each of rlstruct's two start methods, in a process of its own as
the script runs it, starts its workers twice and reports both starts and the CPU seconds of every process involved."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ForkedCommand

ROOT = Path(__file__).resolve().parents[2]


def _forked(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """``python benchmarks/worker_start.py --one NAME --workers 1``, the script's ``main`` in a child forked from this
    process and started as a fresh one (``tests.helpers.ForkedCommand``: a fork server and a resource tracker of its
    own, none of pytest's state; its CPU seconds and its children's its own from the fork on): what it printed."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the script's folder, first, as `python SCRIPT` has it
    import worker_start

    argv = ["benchmarks/worker_start.py", "--one", name, "--workers", "1"]

    def main() -> int:
        sys.argv = argv
        worker_start.main()
        return 0

    done = ForkedCommand([], tmp_path / "worker-start", call=main).completed(argv, 100)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork server", "spawn"])
def test_one_configuration_reports_both_starts_and_their_cpu_seconds(method, tmp_path, monkeypatch):
    """The fork server's configuration runs as the script runs it, in a fresh interpreter (``python
    benchmarks/worker_start.py --one ...``: the command line itself proven); the spawn one, whose spawned workers are
    fresh interpreters of their own, in a fork of this process (:func:`_forked`), which spares the interpreter that
    would import torch and rlstruct before the figures start counting (2-3 CPU s)."""
    name = f"rlstruct {method}, 1 workers"
    if method == "spawn":
        stdout = _forked(name, tmp_path, monkeypatch)
    else:
        out = subprocess.run([sys.executable, "benchmarks/worker_start.py", "--one", name, "--workers", "1"],
                             cwd=ROOT, capture_output=True, text=True, timeout=100)
        assert out.returncode == 0, out.stderr[-3000:]
        stdout = out.stdout
    result = json.loads(stdout.strip().splitlines()[-1])
    assert set(result) == {"first_s", "again_s", "cpu_s"} and all(v > 0 for v in result.values()), result
