"""The README's examples run as written, and its two set-up commands do what it says they do."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def _ten_lines() -> str:
    """The python block of the README's "Ten lines" section."""
    section = README.read_text().split("## Ten lines\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    for code in blocks:
        if code != _ten_lines():  # run, and its output checked, by the test below
            exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})


def test_the_ten_lines_are_ten_and_print_a_random_policys_mean_return():
    code = _ten_lines()
    assert len([line for line in code.splitlines() if line.strip()]) == 10, code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(README), "exec"), {"__name__": "readme_example"})
    printed = re.fullmatch(r"tensor\(([\d.]+)\)\n", out.getvalue())
    assert printed, out.getvalue()
    # A random policy's CartPole episodes last about 22 steps (the return: 1 a step), where a policy that holds the
    # pole reaches 500; a 64-step auto-reset window's reward sum would print 64 whatever the policy.
    assert 10 < float(printed.group(1)) < 40, out.getvalue()


def _setup_commands() -> list[str]:
    """The commands of the README's first bash block (the set-up section), comments dropped."""
    text = README.read_text()
    section = text.split("## Set up and run", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def _dry_run(target: str, venv: Path) -> list[str]:
    """What ``make TARGET`` runs on a machine without the virtual environment (``make -n``, nothing executed)."""
    # Run as from a shell, also when the suite itself runs under make (no inherited flags or level).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", f"VENV={venv}", target],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=60, env=env,
    )
    return out.stdout.splitlines()


# Pages of the documentation site whose python blocks are whole programs (the others show fragments: a signature,
# a call order, a cluster's set-up).
RUNNABLE_PAGES = ["docs/getting-started.md", "docs/concepts/structures.md", "docs/concepts/envs.md", "docs/scaling.md",
                  "docs/statistics.md"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_documented_python_blocks_run(page):
    blocks = [b for b in re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S)
              # the RayBatcher block needs a cluster: tests/batchers/test_ray_batcher.py runs it
              if "ray.init" not in b]
    assert blocks, f"{page} has no python example"
    for code in blocks:
        exec(compile(code, page, "exec"), {"__name__": "docs_example"})


@pytest.mark.parametrize("name", ["README.md", "BENCHMARKS.md"])
def test_relative_links_lead_to_files(name):
    text = (ROOT / name).read_text()
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert targets, f"{name} links nothing"
    missing = [t for t in targets if t and not (ROOT / t).exists()]
    assert not missing, f"{name} links to files that do not exist: {missing}"


def test_readme_gives_the_two_setup_commands():
    assert _setup_commands() == ["make demo", "make test"]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_setup_commands_build_the_venv_then_train_and_test(tmp_path):
    venv = tmp_path / "venv"  # absent: make must create and fill it before anything else
    demo, test = _dry_run("demo", venv), _dry_run("test", venv)
    for commands in (demo, test):
        assert re.search(r"-m venv " + re.escape(str(venv)), commands[0]), commands
        install = next(c for c in commands if "/bin/uv pip install " in c and "-e " in c)  # the package itself
        extras = re.search(r"\.\[([\w,]*)\]", install).group(1).split(",")
        assert ("test" in extras) == (commands is test), install  # with its test extra for make test only
    assert any(re.search(r"/bin/rlstruct train \w+ --env CartPole-v1", c) for c in demo), demo
    assert any("-m ruff check" in c for c in test), test
    assert any("-m pytest" in c and "tests" in c.split() for c in test), test
    # CI runs the README's test command.
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, flags=re.M), ci
