"""The package as a user gets it: its metadata, the sdist and wheel that ``python -m build`` makes from this tree,
and the wheel installed into a clean virtual environment outside the repository, training from another folder.

The build runs without isolation (on the test environment's setuptools, which must satisfy ``[build-system]``),
in a copy of the tree, so that nothing is written into the checkout. The clean environment gets the wheel in its
own site-packages (``pip install --no-deps``) and takes the third-party dependencies (torch, gymnasium, ...) from
the test environment's site-packages through one ``.pth`` file of plain path lines. A path line only extends
``sys.path``: the ``.pth`` files of the folder it names (the editable install's import hook among them) are not
run, so ``import rlstruct`` finds the wheel's copy, and the test checks that it does.
"""

from __future__ import annotations

import email
import email.message
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import rlstruct
from tests.helpers import rlstruct_in_process

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
VERSION = rlstruct.__version__
# What a clean clone does not hold (each is in .gitignore): left out of the copy the build runs in.
NOT_IN_A_CLONE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", "runs", "site",
                                        ".pytest_cache", ".hypothesis", ".whl", ".gl", "MUJOCO_LOG.TXT")


def package_folders() -> dict[str, Path]:
    """``{import package: source folder}`` for every package of the source tree, from pyproject's ``package-dir``.

    A package is a folder holding an ``__init__.py`` under one of the mapped folders, at any depth
    (``algos/_train`` installs as ``rlstruct.algos._train``).
    """
    found = {}
    for package, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            parts = init.parent.relative_to(ROOT / folder).parts
            if "__pycache__" not in parts:
                found[".".join((package, *parts))] = init.parent
    return found


def source_files() -> dict[str, str]:
    """``{path in the wheel: path in the tree}`` for every ``.py`` file of the package folders, and the package data
    ``[tool.setuptools.package-data]`` names (``py.typed``, the score table, the reference runs)."""
    folders = PYPROJECT["tool"]["setuptools"]["package-dir"]
    files = {}
    for package, folder in folders.items():
        for path in (ROOT / folder).rglob("*.py"):
            relative = path.relative_to(ROOT / folder)
            if "__pycache__" not in relative.parts:
                files["/".join((*package.split("."), *relative.parts))] = path.relative_to(ROOT).as_posix()
    for package, patterns in PYPROJECT["tool"]["setuptools"]["package-data"].items():
        for pattern in patterns:
            for path in (ROOT / folders[package]).glob(pattern):
                relative = path.relative_to(ROOT / folders[package])
                files["/".join((*package.split("."), *relative.parts))] = path.relative_to(ROOT).as_posix()
    return files


# ------------------------------------------------------------------------ metadata, read from the sources


def test_the_license_file_is_mit_for_the_rlstruct_authors():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the rlstruct authors" in text
    assert "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND" in text


def test_pyproject_states_the_license_in_pep_639_form_with_the_setuptools_that_reads_it():
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]
    # PEP 639: a license expression replaces the license classifiers (setuptools refuses both at once).
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]
    from packaging.requirements import Requirement
    from packaging.version import Version

    (setuptools_req,) = [Requirement(r) for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    # 77.0.3 is the first setuptools that reads `license = "MIT"` and `license-files`; an older bound would let
    # an older setuptools build (and fail on, or misread) the table.
    assert Version("77.0.3") in setuptools_req.specifier and Version("77.0.2") not in setuptools_req.specifier
    # The build below runs on the test environment's setuptools: the test extra asks for the same bound.
    test_extra = [Requirement(r) for r in PROJECT["optional-dependencies"]["test"]]
    assert [r for r in test_extra if r.name == "setuptools"] == [setuptools_req]


def test_pyproject_names_authors_classifiers_urls_and_readme():
    assert PROJECT["authors"] == [{"name": "the rlstruct authors"}]
    assert PROJECT["readme"] == "README.md"
    classifiers = set(PROJECT["classifiers"])
    assert {"Typing :: Typed", "Programming Language :: Python :: 3 :: Only",
            "Topic :: Scientific/Engineering :: Artificial Intelligence"} <= classifiers
    minimum = re.fullmatch(r">=3\.(\d+)", PROJECT["requires-python"]).group(1)
    assert f"Programming Language :: Python :: 3.{minimum}" in classifiers
    assert set(PROJECT["urls"]) >= {"Homepage", "Documentation", "Repository", "Issues", "Changelog"}
    assert all(url.startswith("https://") for url in PROJECT["urls"].values())


def test_the_version_has_one_source_the_packages_own():
    assert "version" in PROJECT["dynamic"] and "version" not in PROJECT
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "rlstruct.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)
    assert importlib.metadata.version("rlstruct") == VERSION


def test_the_changelog_has_an_unreleased_section_and_the_current_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n")
    assert "keepachangelog.com" in text and "semver.org" in text
    releases = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, flags=re.M)
    assert releases[0] == ("Unreleased", "")
    assert releases[1][0] == VERSION and releases[1][1], "the newest release is the package's version, with a date"
    for name, _ in releases:  # each heading is a link (the reference at the bottom)
        assert re.search(rf"^\[{re.escape(name)}\]: https://", text, flags=re.M), name
    sections = set(re.findall(r"^### (\w+)$", text, flags=re.M))
    assert sections and sections <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_setuptools_is_told_every_package_of_the_source_tree():
    """A subpackage missing from ``packages`` is left out of the wheel: the slow tests below see it in the built
    wheel, this one sees it in the sources."""
    listed, found = set(PYPROJECT["tool"]["setuptools"]["packages"]), set(package_folders())
    assert listed == found, (f"add to pyproject's [tool.setuptools] packages: {sorted(found - listed)}; "
                             f"listed without a folder: {sorted(listed - found)}")


# ------------------------------------------------------------------------ `rlstruct --version`


def test_version_flag_prints_the_package_version(capsys):
    # The console script's entry point in this process: a fresh one would spend 3 CPU s importing torch to print a
    # line (python -m rlstruct.algos, the same entry point, is the tiny trained run's command in tests/conftest.py).
    out = rlstruct_in_process(capsys, "--version")
    assert (out.returncode, out.stdout, out.stderr) == (0, f"rlstruct {VERSION}\n", "")


# ------------------------------------------------------------------------ the built sdist and wheel


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """The sdist and the wheel built from a copy of the tree (``{"sdist": path, "wheel": path}``)."""
    pytest.importorskip("build", reason="building the package needs the test extra's build")
    work = tmp_path_factory.mktemp("build")
    shutil.copytree(ROOT, work / "src", ignore=NOT_IN_A_CLONE)
    # Without an --sdist/--wheel choice, build makes the sdist, then the wheel from the unpacked sdist: a file the
    # sdist lacks is missing from the wheel too.
    out = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(work / "dist"),
                          str(work / "src")], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (sdist,) = (work / "dist").glob("*.tar.gz")
    (wheel,) = (work / "dist").glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        return email.message_from_string(z.read(f"rlstruct-{VERSION}.dist-info/METADATA").decode("utf-8"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_sdist_and_the_wheel_pass_twine_check_strict(dist):
    pytest.importorskip("twine", reason="checking the distributions needs the test extra's twine")
    out = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(dist["sdist"]), str(dist["wheel"])],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("PASSED") == 2, out.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_wheel_holds_every_module_of_every_package_and_nothing_else(dist):
    assert dist["wheel"].name == f"rlstruct-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(dist["wheel"]) as z:
        names = set(z.namelist())
    info = f"rlstruct-{VERSION}.dist-info/"
    code = {n for n in names if not n.startswith(info)}
    expected = set(source_files())
    assert code == expected, (f"missing from the wheel: {sorted(expected - code)}; "
                              f"in the wheel but not the sources: {sorted(code - expected)}")
    packages = {n.rpartition("/")[0].replace("/", ".") for n in code if n.endswith("/__init__.py")}
    assert packages == set(package_folders())
    assert {"rlstruct.agents", "rlstruct.batchers", "rlstruct.algos", "rlstruct.envs"} <= packages
    # Only the one import package: no generic top-level `agents`, `algos`, `tests` or `benchmarks`.
    assert {n.split("/")[0] for n in code} == {"rlstruct"}
    assert f"{info}licenses/LICENSE" in names and f"{info}entry_points.txt" in names
    with zipfile.ZipFile(dist["wheel"]) as z:
        assert z.read(f"{info}licenses/LICENSE").decode() == (ROOT / "LICENSE").read_text()
        assert "rlstruct = rlstruct.algos._train.cli:main" in z.read(f"{info}entry_points.txt").decode()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_wheel_metadata_names_license_authors_urls_and_classifiers(dist):
    meta = wheel_metadata(dist["wheel"])
    assert meta["Name"] == "rlstruct" and meta["Version"] == VERSION
    assert meta["License-Expression"] == "MIT" and meta.get_all("License-File") == ["LICENSE"]
    assert meta["Author"] == "the rlstruct authors"
    assert meta["Requires-Python"] == PROJECT["requires-python"]
    assert meta.get_all("Classifier") == PROJECT["classifiers"]
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert urls == PROJECT["urls"]
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().strip() == (ROOT / "README.md").read_text().strip()
    extras = set(meta.get_all("Provides-Extra"))
    assert set(PROJECT["optional-dependencies"]) == extras


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_sdist_holds_the_sources_license_and_changelog_and_no_tests(dist):
    with tarfile.open(dist["sdist"]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    top = f"rlstruct-{VERSION}"
    assert dist["sdist"].name == f"{top}.tar.gz"
    assert {"pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "PKG-INFO"} <= names
    missing = sorted(set(source_files().values()) - names)
    assert not missing, f"missing from the sdist: {missing}"
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "tutorials/"))]


# ------------------------------------------------------------------------ the wheel in a clean environment


def run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """``cmd`` as a user's shell runs it: no PYTHONPATH, the repository nowhere in the environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run(cmd, cwd=cwd, env={**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_wheel_installed_in_a_clean_venv_trains_from_another_folder(dist, tmp_path):
    venv, elsewhere = tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    out = run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
               str(dist["wheel"])], cwd=elsewhere, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    cwd=elsewhere, timeout=30).stdout.strip())
    ours = sysconfig.get_paths()
    (site / "test_environment_dependencies.pth").write_text(
        "\n".join(dict.fromkeys([ours["purelib"], ours["platlib"]])) + "\n")

    train = run([str(venv / "bin" / "rlstruct"), "train", "a2c", "--env", "CartPole-v1", "--max-env-steps", "2000",
                 "--logdir", "run"], cwd=elsewhere, timeout=300)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    summary = json.loads((elsewhere / "run" / "summary.json").read_text())
    assert summary["env_steps"] >= 2000 and summary["eval_return"] > 0
    assert (elsewhere / "run" / "checkpoint.pt").is_file() and (elsewhere / "run" / "progress.csv").is_file()

    # Where the packages come from, read by the process that then evaluates the run through the console script's
    # entry point (``rlstruct eval``, its first line the probe's): one interpreter importing torch, not two. The
    # console script itself is the training command's above.
    probe = ("import importlib.metadata, json, sys, rlstruct, rlstruct.algos, rlstruct.agents, rlstruct.batchers; "
             "print(json.dumps({'files': [m.__file__ for m in (rlstruct, rlstruct.algos, rlstruct.agents, "
             "rlstruct.batchers)], 'path': sys.path, 'version': rlstruct.__version__, "
             "'dist_version': importlib.metadata.version('rlstruct'), "
             "'license': importlib.metadata.metadata('rlstruct')['License-Expression'], "
             "'editable_hooks': [m for m in sys.modules if '__editable__' in m]}), flush=True); "
             "(main,) = importlib.metadata.entry_points(group='console_scripts', name='rlstruct'); "
             "sys.argv = ['rlstruct', 'eval', 'run/checkpoint.pt', '--episodes', '2']; sys.exit(main.load()())")
    evaluated = run([str(python), "-c", probe], cwd=elsewhere, timeout=120)
    assert evaluated.returncode == 0, evaluated.stdout[-3000:] + evaluated.stderr[-3000:]
    seen = json.loads(evaluated.stdout.splitlines()[0])
    assert all(Path(f).is_relative_to(site) for f in seen["files"]), seen["files"]
    assert seen["version"] == seen["dist_version"] == VERSION and seen["license"] == "MIT"
    assert seen["editable_hooks"] == [], "the test environment's editable install was loaded"
    # The checkout is nowhere on sys.path: only the test environment's site-packages, which may live inside it.
    allowed = {Path(ours["purelib"]).resolve(), Path(ours["platlib"]).resolve()}
    for entry in seen["path"]:
        resolved = Path(entry or elsewhere).resolve()
        assert resolved in allowed or not resolved.is_relative_to(ROOT), f"{entry} is in the repository"
