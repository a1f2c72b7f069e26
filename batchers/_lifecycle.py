"""Closing batchers that their program forgot to close, at garbage collection and at interpreter exit, with a
:class:`ResourceWarning` naming where the batcher was created.
"""

from __future__ import annotations

import atexit
import multiprocessing.util  # noqa: F401  (its atexit hook must be registered before ours: see track)
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["creation_site", "track", "untrack"]

_LIVE: set[weakref.finalize] = set()
_LOCK = threading.Lock()
_HOOKED = False
# Frames of these modules are the batcher's own: the creation site is the first frame outside them.
_INTERNAL = ("rlstruct.batchers", "contextlib")


def creation_site() -> tuple[str, int, str]:
    """``(file, line, function)`` of the caller that built the batcher (the first frame outside the batchers),
    read from the live frames: no traceback is formatted, so it costs microseconds."""
    frame = sys._getframe(1)
    last = frame
    while frame is not None:
        last = frame
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(_INTERNAL):
            break
        frame = frame.f_back
    code = last.f_code
    return code.co_filename, last.f_lineno, code.co_name


def _close_all_at_exit() -> None:
    with _LOCK:
        live = list(_LIVE)
    for f in live:
        f()  # a finalizer runs once: those closed or collected already are no-ops


def _release(what: str, site: tuple[str, int, str], release: Callable[..., Any], args: tuple) -> None:
    filename, lineno, function = site
    # Attributed to the creation site, so that warning filters by module and the default one-per-location
    # rule see the user's line, not this module's.
    warnings.warn_explicit(
        f"unclosed {what} created at {filename}:{lineno} in {function}; it was closed for you (its workers "
        "stopped): call close() or build it in a `with` block", ResourceWarning, filename, lineno,
    )
    release(*args)


def track(obj: Any, what: str, release: Callable[..., Any], *args: Any) -> weakref.finalize:
    """Has ``release(*args)`` run, with a ResourceWarning, when ``obj`` is collected or at interpreter exit,
    whichever comes first, unless the returned finalizer is detached (an explicit ``close()``).

    Args:
        obj: the batcher.
        what: how the warning names it, e.g. ``"RL_Batcher with 2 worker processes"``.
        release: closes the resources; takes ``args`` only. It must not refer to ``obj`` (through a bound method,
            a closure or ``args``), or ``obj`` would never be collected.
        args: what ``release`` closes (mutable containers the batcher fills and empties as it runs).
    """
    global _HOOKED
    site = creation_site()
    f = weakref.finalize(obj, _release, what, site, release, args)
    f.atexit = False  # closed by _close_all_at_exit, before multiprocessing's own hook
    with _LOCK:
        if not _HOOKED:
            # multiprocessing's own atexit hook terminates daemon children with SIGTERM and then joins them, but
            # batcher workers ignore SIGTERM (a scheduler sends it to the whole job; the parent owns shutdown), so
            # that join would wait forever. atexit runs the hook registered last first, and this one comes after
            # multiprocessing.util's (imported above): every batcher is closed before multiprocessing joins.
            atexit.register(_close_all_at_exit)
            _HOOKED = True
        # Finalizers that ran or were detached are dropped here, so the set stays as small as the open batchers.
        _LIVE.difference_update([g for g in _LIVE if not g.alive])
        _LIVE.add(f)
    return f


def untrack(f: weakref.finalize | None) -> None:
    """Detaches ``f`` (the batcher is being closed explicitly): no warning, no second release."""
    if f is None:
        return
    with _LOCK:
        _LIVE.discard(f)
    f.detach()
