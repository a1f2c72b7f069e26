"""A clone of the repository named ``rlstruct``, in the folder a script runs from: batcher workers start (their fork
server does not look in the current folder); the script's own imports find the installed package where it lies in a
``sys.path`` folder (a wheel, or ``make install``'s strict editable install, whose link tree a ``.pth`` line names),
since a package with an ``__init__.py`` on any ``sys.path`` entry comes before a folder without one. Where the install
is setuptools' default editable import hook, which Python asks only after every ``sys.path`` entry, the clone is
imported as a namespace package in its place, and importing ``rlstruct.batchers`` or ``rlstruct.algos`` through it
says so in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import rlstruct.batchers._shadow as shadow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent("""
    import torch
    from rlstruct import DictTensor, RL_Agent, RL_Batcher
    from rlstruct.envs import CartPole


    class Random(RL_Agent):
        def __call__(self, state, observation, agent_info, history=None):
            return DictTensor({"action": torch.randint(0, 2, (observation.n_elems(),))}), state


    if __name__ == "__main__":
        with RL_Batcher(n_timesteps=500, create_agent=Random, agent_args={}, create_env=CartPole,
                        env_args={"n_envs": 8}, n_processes=2, seeds=[0, 1]) as batcher:
            batcher.reset(); batcher.execute()
            print(batcher.get()[0].trajectories.lengths.shape)
""")
ONE_LINE = ("ImportError: 'rlstruct' was imported from {clone}, a folder named rlstruct without __init__.py (a clone "
            "of the repository?) that comes before the installed package on sys.path (the current folder, or the "
            "script's); run from another folder, or rename the clone (e.g. rlstruct-repo)")


@pytest.fixture
def clone_folder(tmp_path) -> Path:
    """A folder holding a clone named rlstruct: the repository's layout (its package folders, no __init__.py)."""
    clone = tmp_path / "rlstruct"
    clone.mkdir()
    for name in ("agents", "batchers", "algos", "rlstruct"):
        (clone / name).symlink_to(ROOT / name, target_is_directory=True)
    (clone / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    return tmp_path


def _python(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RLSTRUCT_START_METHOD")}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_workers_start_from_the_folder_that_holds_a_clone(clone_folder):
    scripts = clone_folder / "scripts"
    scripts.mkdir()
    (scripts / "collect.py").write_text(SCRIPT)
    result = _python([str(scripts / "collect.py")], clone_folder)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "torch.Size([16])"


def _installed_in_a_path_folder() -> bool:
    """Whether a ``sys.path`` folder other than the repository holds the installed ``rlstruct`` package."""
    return any(Path(entry, "rlstruct", "__init__.py").is_file() for entry in sys.path
               if entry and Path(entry).resolve() != ROOT)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("args", [["-c", "from rlstruct.batchers import RL_Batcher"],
                                  ["-c", "import rlstruct.algos"],
                                  ["-m", "rlstruct.algos", "--version"]])
def test_importing_from_the_folder_that_holds_a_clone(clone_folder, args):
    result = _python(args, clone_folder)
    if _installed_in_a_path_folder():
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        assert result.returncode == 1
        assert result.stderr.strip().splitlines()[-1] == ONE_LINE.format(clone=clone_folder / "rlstruct")


def test_a_namespace_package_in_place_of_rlstruct_is_named(monkeypatch):
    shadow.check_installed_package()  # the installed package passes
    namespace = types.ModuleType("rlstruct")
    namespace.__path__ = ["/somewhere/rlstruct"]
    monkeypatch.setitem(sys.modules, "rlstruct", namespace)
    with pytest.raises(ImportError, match=r"^'rlstruct' was imported from /somewhere/rlstruct, a folder named "
                                          r"rlstruct without __init__.py .*; run from another folder, or rename"):
        shadow.check_installed_package()
