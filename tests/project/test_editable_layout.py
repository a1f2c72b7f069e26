"""The editable install of ``make install``, as editors see it: setuptools' strict mode, whose ``.pth`` file puts on
``sys.path`` a folder of links laid out as the installed package (``agents/`` as ``rlstruct/agents/``, ...). Static
tools (jedi, pyright) read that path line, where they cannot run the default mode's import hook, and so resolve
``rlstruct.agents``, ``rlstruct.batchers`` and ``rlstruct.algos`` in a checkout as in an installed wheel.

The checks read the Makefile (``make -n``, nothing installed) and what the install left in this environment: the
``.pth`` file its record lists, the folder that file names, and the links in it against the package's files. Where
rlstruct is not installed editable from this checkout (a wheel, another clone), the checks of the environment skip.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
import shutil
import subprocess
import sysconfig
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

import rlstruct
import rlstruct.agents
import rlstruct.algos
import rlstruct.batchers
from tests.project.test_packaging import source_files

ROOT = Path(__file__).resolve().parents[2]
STRICT = "rlstruct:editable_mode=strict"
RELINK = "run make install, or pip install -e . --config-settings editable_mode=strict"


# ------------------------------------------------------------------------ the Makefile


@pytest.fixture
def makefile_copy(tmp_path: Path) -> Path:
    """A folder holding what the Makefile's install rules read, for ``make -n``."""
    if shutil.which("make") is None:
        pytest.skip("needs GNU make")
    for name in ("Makefile", "pyproject.toml", "requirements/cpu.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def dry_run(folder: Path, *targets: str) -> list[str]:
    out = subprocess.run(["make", "-n", *targets], cwd=folder, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.timeout(60)
def test_every_editable_install_of_the_makefile_is_strict(makefile_copy):
    lines = dry_run(makefile_copy, "install", "demo", "docs", "TORCH_BUILD=cpu")
    editable = [ln for ln in lines if "uv pip install" in ln and " -e " in ln]
    # the full install, the demo's, the links laid again by `make install`, the docs extra
    assert len(editable) == 4, lines
    assert all(f"--config-settings-package {STRICT}" in ln for ln in editable), editable


@pytest.mark.timeout(60)
def test_make_test_lays_the_links_again_before_the_suite_runs(makefile_copy):
    (makefile_copy / ".venv").mkdir()
    for stamp in (".installed", ".demo-installed"):  # installed already, and newer than pyproject.toml
        (makefile_copy / ".venv" / stamp).touch()
    lines = dry_run(makefile_copy, "test")
    relink = next(i for i, ln in enumerate(lines) if " --no-deps -e . " in ln and STRICT in ln)
    suite = next(i for i, ln in enumerate(lines) if " -m pytest " in ln)
    assert relink < suite, lines
    assert not any("-m venv" in ln or "-e '.[" in ln for ln in lines), lines  # nothing else is installed again


# ------------------------------------------------------------------------ what the install left here


@pytest.fixture(scope="module")
def link_tree() -> Path:
    """The folder the editable install's ``.pth`` file names, read as a static tool reads it: plain path lines only.

    Skips where rlstruct is not installed editable from this checkout; fails where the install is setuptools' default
    mode (an import hook, no path line), which editors do not follow."""
    # The environment's own record: an rlstruct.egg-info that a build left in the checkout's root (on sys.path here)
    # would come first for importlib.metadata.distribution.
    site = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    found = list(importlib.metadata.distributions(name="rlstruct", path=list(site)))
    if not found:
        pytest.skip(f"rlstruct is not installed in this environment's site-packages ({list(site)})")
    dist = found[0]
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    source = Path(unquote(urlparse(direct.get("url", "")).path)) if direct.get("url", "").startswith("file:") else None
    if not direct.get("dir_info", {}).get("editable") or source is None or source.resolve() != ROOT:
        pytest.skip(f"rlstruct is not installed editable from {ROOT} (direct_url.json: {direct})")
    pth = [f for f in dist.files or [] if f.name.endswith(".pth")]
    assert len(pth) == 1, f"the editable install's record lists {len(pth)} .pth files: {pth}"
    pth_file = Path(dist.locate_file(pth[0]))
    lines = [ln.strip() for ln in pth_file.read_text().splitlines()]
    hooks = [ln for ln in lines if ln.startswith(("import ", "import\t"))]
    # as site.py reads a path line: relative to the .pth file's folder
    folders = [pth_file.parent / ln for ln in lines if ln and not ln.startswith("#") and ln not in hooks]
    assert not hooks and len(folders) == 1, (
        f"{pth[0]} holds {lines}: the editable install is setuptools' default, an import hook that editors and type "
        f"checkers do not run, rather than one path line; {RELINK}")
    return folders[0]


def test_the_path_line_alone_finds_every_package_in_the_checkout(link_tree):
    folders = {"rlstruct": "rlstruct", "rlstruct.agents": "agents", "rlstruct.batchers": "batchers",
               "rlstruct.algos": "algos"}
    for package, folder in folders.items():
        init = link_tree.joinpath(*package.split("."), "__init__.py")
        assert init.is_file(), f"{init} is missing: {package} does not resolve from the path line; {RELINK}"
        assert init.resolve() == ROOT / folder / "__init__.py", f"{init} leads to {init.resolve()}, not the checkout"


def test_every_file_of_the_package_has_its_link_and_no_link_is_left_over(link_tree):
    """Strict mode links the files there are at install time: a module added since has no link (its import fails),
    one removed leaves a link to nothing."""
    expected = source_files()
    laid = {p.relative_to(link_tree).as_posix(): p for p in link_tree.rglob("*")
            if (p.is_file() or p.is_symlink()) and "__pycache__" not in p.parts}
    missing, extra = sorted(set(expected) - set(laid)), sorted(set(laid) - set(expected))
    assert not missing and not extra, (f"the editable install's links are out of date (without a link: {missing}; "
                                       f"left over: {extra}); {RELINK}")
    wrong = {wheel_path: str(laid[wheel_path].resolve()) for wheel_path, source in expected.items()
             if laid[wheel_path].resolve() != ROOT / source}
    assert not wrong, f"links that do not lead to this checkout's files: {wrong}; {RELINK}"


def test_the_checkouts_sources_and_package_data_are_what_python_imports(link_tree):
    # Python started in the checkout's root (pytest's rootdir here, or `python -m` run there) finds its rlstruct/
    # first, and rlstruct/__init__.py's extend_path adds the link tree's, which holds the subpackages.
    assert link_tree / "rlstruct" in [Path(p) for p in rlstruct.__path__], rlstruct.__path__
    assert Path(rlstruct.__file__).resolve() == ROOT / "rlstruct" / "__init__.py", rlstruct.__file__
    for module, folder in ((rlstruct.agents, "agents"), (rlstruct.batchers, "batchers"), (rlstruct.algos, "algos")):
        assert Path(module.__file__).resolve() == ROOT / folder / "__init__.py", module.__file__
    table = importlib.resources.files("rlstruct.algos") / "data" / "score_table.json"
    assert Path(str(table)).resolve() == ROOT / "algos" / "data" / "score_table.json"
