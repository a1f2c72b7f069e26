"""The optional backends' imports, each with what it needs set first, and a :class:`MissingDependencyError` that
names the extra to install when the package is missing."""

from __future__ import annotations

import os
from types import ModuleType

from rlstruct.errors import MissingDependencyError

__all__ = ["import_jax", "import_ale"]


def import_jax() -> ModuleType:
    """``jax``, imported with GPU preallocation off unless the user chose otherwise: JAX's GPU backend would
    otherwise take most of the GPU's memory when it starts, and starve torch on the same GPU (set
    ``XLA_PYTHON_CLIENT_PREALLOCATE`` yourself before importing jax if your code imports it first).

    Raises:
        MissingDependencyError: jax is not installed.
    """
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        import jax.dlpack  # noqa: F401  (a submodule jax does not always import)
    except ImportError as e:
        raise MissingDependencyError(
            "JAX envs need jax; install them with `pip install 'rlstruct[jax]'` (jax and gymnax)"
        ) from e
    return jax


def import_ale() -> ModuleType:
    """``ale_py`` (whose import registers its ROMs).

    Raises:
        MissingDependencyError: ale-py is not installed.
    """
    try:
        import ale_py
    except ImportError as e:
        raise MissingDependencyError(
            "Atari envs need ale-py; install it with `pip install 'rlstruct[atari]'` (ale-py ships the ROMs), "
            "or use another backend"
        ) from e
    return ale_py
