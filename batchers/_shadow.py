"""The check that the ``rlstruct`` Python imported is the installed package, not a folder of that name without an
``__init__.py`` (a clone of the repository, run from the folder holding it) that comes first on ``sys.path`` and is
imported as a namespace package: then none of the core imports, and only this file's folder (the clone's
``batchers``, found through the namespace) can say why. It imports nothing of rlstruct's but the package itself, and
checks as it is imported (first thing in ``rlstruct.batchers``)."""

from __future__ import annotations

import importlib

__all__ = ["check_installed_package"]


def check_installed_package() -> None:
    """Raises ImportError, in one line, where ``rlstruct`` is a namespace package (it has no ``__file__``).

    >>> check_installed_package()
    """
    root = importlib.import_module("rlstruct")  # imported already: a package's parents are imported before it
    if getattr(root, "__file__", None) is not None:
        return
    where = next(iter(root.__path__), "a folder on sys.path")
    raise ImportError(f"'rlstruct' was imported from {where}, a folder named rlstruct without __init__.py (a clone "
                      "of the repository?) that comes before the installed package on sys.path (the current folder, "
                      "or the script's); run from another folder, or rename the clone (e.g. rlstruct-repo)")


check_installed_package()
