"""The Makefile's install targets, read with ``make -n`` in a copy (nothing installed): ``make demo`` installs the
demo's extras only, ``make install``/``make test`` every extra, each with its own stamp, in either order."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What `make install` installs: every extra that CI tests.
EVERY_EXTRA = ("-e '.[test,tensorboard,plot,progress,ray,fast,atari,minatar,box2d,jax,mujoco,brax,video,"
               "stats,sweep,mlflow,wandb,trackio,export,datasets]'")
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    for name in ("Makefile", "pyproject.toml", "requirements/cpu.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".venv").mkdir()
    return tmp_path


def dry_run(checkout: Path, *args: str) -> str:
    out = subprocess.run(["make", "-n", *args], cwd=checkout, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def stamp(checkout: Path, *names: str) -> None:
    later = time.time() + 10
    for name in names:
        path = checkout / ".venv" / name
        path.touch()
        os.utime(path, (later, later))


@pytest.mark.timeout(60)
def test_demo_installs_the_demos_extras_only_and_the_cpu_torch_alone_first(checkout):
    out = dry_run(checkout, "demo", "TORCH_BUILD=cpu")
    lines = out.splitlines()
    torch_line = next(i for i, ln in enumerate(lines) if "--no-deps -r requirements/cpu.txt" in ln)
    uv_line = next(i for i, ln in enumerate(lines) if "-m pip install -q uv==" in ln)
    extras_line = next(i for i, ln in enumerate(lines) if "-e '.[plot,progress,tensorboard]'" in ln)
    # torch by pip alone first, then uv (pinned) installs the rest into the venv's Python, keeping that torch
    assert torch_line < uv_line < extras_line
    assert ".venv/bin/uv pip install -q --python .venv/bin/python -e" in lines[extras_line]
    assert "jax" not in out and "ray" not in out and "mujoco" not in out
    assert "touch .venv/.demo-installed" in out and "rlstruct train a2c --env CartPole-v1" in out


@pytest.mark.timeout(60)
def test_install_takes_every_extra_and_stamps_the_demos_too(checkout):
    out = dry_run(checkout, "install", "TORCH_BUILD=cpu")
    assert EVERY_EXTRA in out
    assert "touch .venv/.installed .venv/.demo-installed" in out


@pytest.mark.timeout(60)
def test_a_gpu_build_does_not_read_the_cpu_requirements(checkout):
    out = dry_run(checkout, "demo", "TORCH_BUILD=pypi")
    assert "requirements/cpu.txt" not in out and "-e '.[plot,progress,tensorboard]'" in out


@pytest.mark.timeout(60)
def test_test_then_demo_installs_nothing_more(checkout):
    stamp(checkout, ".installed", ".demo-installed")
    out = dry_run(checkout, "demo")
    assert "pip" not in out and "rlstruct train a2c" in out


@pytest.mark.timeout(60)
def test_demo_then_install_adds_every_extra(checkout):
    stamp(checkout, ".demo-installed")
    assert "pip" not in dry_run(checkout, "demo")
    assert EVERY_EXTRA in dry_run(
        checkout, "install")


def test_the_cpu_requirements_name_pytorchs_cpu_index_and_pin_torch():
    lines = [ln.strip() for ln in (ROOT / "requirements/cpu.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    assert any(ln.startswith("torch==") for ln in lines)


@pytest.mark.timeout(60)
def test_test_runs_two_xdist_workers_by_default_with_the_runs_budget_and_leak_checks(checkout):
    stamp(checkout, ".installed", ".demo-installed")
    pytest_line = next(ln for ln in dry_run(checkout, "test").splitlines() if " -m pytest " in ln)
    assert " -n 2 --dist loadgroup --cpu-budget --leak-check " in pytest_line
    more = next(ln for ln in dry_run(checkout, "quick", "TEST_WORKERS=4").splitlines() if " -m pytest " in ln)
    assert " -n 4 --dist loadgroup " in more and more.endswith('-m "not slow"')
    # the workers come from the test extra
    assert '"pytest-xdist>=' in (ROOT / "pyproject.toml").read_text()
