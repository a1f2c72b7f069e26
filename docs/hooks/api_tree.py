"""MkDocs hook: the installed package's layout, for mkdocstrings to read.

The repository keeps ``rlstruct.agents``, ``rlstruct.batchers`` and ``rlstruct.algos`` in the top-level folders
``agents/``, ``batchers/`` and ``algos/`` (setuptools' ``package-dir`` mapping), so a static reader that walks
``rlstruct/`` finds none of them. This hook lays out ``build/docs-api/rlstruct/`` as the installed package looks
(links to the sources, nothing copied) before any page is rendered; ``mkdocs.yml`` points mkdocstrings there.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "build" / "docs-api"


def _package_dirs() -> dict[str, str]:
    """``pyproject.toml``'s ``package-dir`` mapping: package name -> folder, relative to the repository."""
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # 3.10: the one inline table this needs, read by pattern
        table = re.search(r"^package-dir\s*=\s*\{(.*?)\}", text, flags=re.M | re.S).group(1)
        return dict(re.findall(r'"([^"]+)"\s*=\s*"([^"]+)"', table))
    return tomllib.loads(text)["tool"]["setuptools"]["package-dir"]


def build_tree() -> Path:
    """Creates (afresh) the link tree and returns the folder to give mkdocstrings as its search path."""
    if TREE.exists():
        shutil.rmtree(TREE)
    mapping = _package_dirs()
    top = TREE / "rlstruct"
    top.mkdir(parents=True)
    for entry in (ROOT / mapping["rlstruct"]).iterdir():
        if entry.name != "__pycache__":
            os.symlink(entry, top / entry.name)
    for name, folder in mapping.items():
        if name != "rlstruct":
            os.symlink(ROOT / folder, top / name.split(".", 1)[1])
    return TREE


# Before mkdocstrings' own on_config, which resolves its search paths.
@event_priority(100)
def on_config(config):
    """Lays out the tree before mkdocstrings looks for the packages."""
    build_tree()
    return config
