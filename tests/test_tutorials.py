"""Every tutorial runs to the end, small, in its own process.

Each ``tutorials/NN_*.py`` states its claims as asserts, so exit code 0 means they all held. The
tutorials are collected by pattern: a new one is tested without touching this file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9]*.py"))
# The one size knob of every tutorial: small enough that the whole file stays well under two minutes.
SCALE = "0.1"
TIMEOUT_S = 100

pytestmark = pytest.mark.timeout(TIMEOUT_S + 20)


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


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path: Path):
    env = {**os.environ, "RLSTRUCT_TUTORIAL_SCALE": SCALE}
    env.pop("RLSTRUCT_CHECK_DEVICE", None)
    try:
        proc = subprocess.run(
            [sys.executable, str(path.relative_to(ROOT))],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        out = "\n".join(x.decode(errors="replace") if isinstance(x, bytes) else x for x in (e.stdout, e.stderr) if x)
        pytest.fail(f"{path.name} did not finish within {TIMEOUT_S} s; output so far:\n{out[-4000:]}")
    output = f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"{path.name} exited with {proc.returncode}\n{output}"
    assert "all claims hold" in proc.stdout
