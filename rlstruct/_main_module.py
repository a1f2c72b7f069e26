"""How code defined in a ``__main__`` without a file (a notebook cell, ``python -``, ``python -c``) reaches a child
process: by value, where a script run as a file is imported again by the child."""

from __future__ import annotations

import os
import pickle
import pickletools
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["by_value_where_needed", "main_file", "main_without_file", "starting_without_main_file"]


def main_file() -> str | None:
    """The file a spawned child runs again as ``__mp_main__`` to find what ``__main__`` defines: the script's path
    (``python script.py``), or ``None`` where there is none to run (``python -m`` imports its module by name
    instead; see :func:`main_without_file`)."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        return None
    path = getattr(main, "__file__", None)
    return path if isinstance(path, str) and os.path.isfile(path) else None


def main_without_file() -> bool:
    """Whether ``__main__`` is code that no child can import again: a notebook (IPython's ``__main__`` has neither
    a spec nor a file), ``python -c``, or ``python -`` (whose ``__file__`` is ``'<stdin>'``). What it defines must
    reach a child by value.

    >>> main_without_file() == (getattr(sys.modules["__main__"], "__spec__", None) is None and main_file() is None)
    True
    """
    main = sys.modules.get("__main__")
    return main is not None and getattr(main, "__spec__", None) is None and main_file() is None


class _ByValue:
    """``obj`` pickled by cloudpickle (what ``__main__`` defines by value, everything importable by reference, as
    gymnasium's ``AsyncVectorEnv`` ships its env factories); it unpickles as ``obj`` itself, with plain pickle."""

    def __init__(self, obj: Any):
        import cloudpickle

        self.data = cloudpickle.dumps(obj)

    def __reduce__(self):
        return pickle.loads, (self.data,)


def _names_main(obj: Any) -> bool:
    """Whether ``obj`` pickled by reference names something of ``__main__`` (a class, a function), or, where it
    cannot be pickled, is itself defined there (a lambda, a local function of a cell)."""
    try:
        data = pickle.dumps(obj, protocol=2)  # protocol 2 names each global in one GLOBAL op: "module name"
    except Exception:
        return getattr(obj, "__module__", None) == "__main__"
    return any(op.name == "GLOBAL" and str(arg).split(" ", 1)[0] == "__main__" for op, arg, _ in
               pickletools.genops(data))


def by_value_where_needed(obj: Any) -> Any:
    """``obj``, or, where ``__main__`` has no file (:func:`main_without_file`) and ``obj`` names what it defines,
    ``obj`` wrapped to be pickled by value: a child process has no way to import it by reference. Anything else
    keeps pickling by reference (and a tensor through torch's shared memory).

    >>> by_value_where_needed(len) is len
    True
    """
    if main_without_file() and _names_main(obj):
        return _ByValue(obj)
    return obj


_MAIN_LOCK = threading.Lock()


@contextmanager
def starting_without_main_file() -> Iterator[None]:
    """Around a child's ``start()``: where ``__main__`` has a ``__file__`` that is no file (``'<stdin>'`` under
    ``python -``), multiprocessing would tell the child to run that path again as ``__mp_main__`` and the child would
    die of ``FileNotFoundError`` before it could report; the name is hidden while the child's preparation data is
    written, as ``python -c`` (no ``__file__``) would have it. Nothing changes for a script run as a file."""
    if not main_without_file():
        yield
        return
    main = sys.modules["__main__"]
    with _MAIN_LOCK:  # held for the whole start: another thread's start must not put the name back meanwhile
        path = getattr(main, "__file__", None)
        if path is not None:
            del main.__file__
        try:
            yield
        finally:
            if path is not None:
                main.__file__ = path
