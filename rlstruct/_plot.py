"""PNG figures without a display: matplotlib on the Agg backend (extra ``rlstruct[plot]``), and saving a figure."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from rlstruct.errors import MissingDependencyError

__all__ = ["pyplot", "save_png"]


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (PNG files, no display).

    Raises:
        MissingDependencyError: matplotlib is not installed.
    """
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError as e:
        raise MissingDependencyError(
            "writing a PNG needs matplotlib, which is not installed; install it with `pip install 'rlstruct[plot]'`"
        ) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(plt: ModuleType, fig: Any, path: str | Path) -> Path:
    """Lays out ``fig``, writes it to ``path`` (100 dpi), closes it and returns ``Path(path)``."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
