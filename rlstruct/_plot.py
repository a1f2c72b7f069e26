"""PNG figures without a display: matplotlib on the Agg backend (extra ``rlstruct[plot]``), saving a figure, and text
from data (a name, a label) drawn as it is (:func:`plain_text`)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from rlstruct.errors import MissingDependencyError

__all__ = ["PLAIN_TEXT", "plain_text", "pyplot", "save_png"]

#: the rc settings under which :func:`plain_text` draws its text as it is: no LaTeX pass over the figure's words
PLAIN_TEXT = {"text.usetex": False}


def plain_text(text: str) -> str:
    """``text`` as matplotlib draws it literally: each ``$`` escaped, so that a name from data (an env id, a group's
    label) cannot open mathtext (``$\\mathrm{...}$``); drawn under :data:`PLAIN_TEXT`, nothing else in it is read
    as markup.

    >>> print(plain_text("cost in $ and $x^2$"))
    cost in \\$ and \\$x^2\\$
    """
    return text.replace("$", "\\$")


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
