"""Closing batchers that their program forgot to close, at garbage collection and at interpreter exit, with a
:class:`ResourceWarning` naming where the batcher was created; and, at exit, reaping multiprocessing's resource
tracker, so that no process of the program outlives it.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["close_all_at_exit", "creation_site", "reap_fork_server", "reap_resource_tracker", "track", "untrack"]

log = logging.getLogger(__name__)

_LIVE: set[weakref.finalize] = set()
_LOCK = threading.Lock()
_HOOKED = False
# Frames of these modules are the batcher's own: the creation site is the first frame outside them.
_INTERNAL = ("rlstruct.batchers", "contextlib")
# Seconds the exit waits for the resource tracker to see its pipe close and exit.
_TRACKER_GRACE_S = 5.0


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


def close_all_at_exit() -> None:
    """What this process's exit does for its batchers: closes every batcher left open, runs multiprocessing's own
    exit (its finalizers: the fork server's socket folder in the temp folder among them) and reaps the fork server
    and the resource tracker. The exit hook; also for a process about to be killed, which runs no exit hook (a Ray
    actor's close). No batcher may be made in this process after it."""
    with _LOCK:
        live = list(_LIVE)
    for f in live:
        f()  # a finalizer runs once: those closed or collected already are no-ops
    # multiprocessing's own exit (it terminates and joins its daemon children and runs its finalizers, which may
    # still unregister resources with the tracker) runs now rather than after this hook: it runs once, so its own
    # turn later is a no-op. Only then may the tracker be stopped.
    multiprocessing.util._exit_function()
    reap_fork_server(_TRACKER_GRACE_S)
    reap_resource_tracker(_TRACKER_GRACE_S)


def reap_resource_tracker(grace: float) -> bool:
    """Stops multiprocessing's resource tracker, if this process started one, and waits at most ``grace`` seconds
    for it to exit; whether it is gone.

    Starting a worker starts the tracker, a child of this process that exits when its pipe closes, i.e. when this
    process is gone: too late for anyone but init to wait for it, so it lingers as a zombie in the program's process
    group. Closing its pipe and waiting here leaves nothing behind. Only for interpreter exit: a later
    multiprocessing call would start a new tracker.
    """
    from multiprocessing import resource_tracker

    return _close_and_wait(resource_tracker._resource_tracker, "_fd", "_pid", "_lock", "resource tracker", grace)


def reap_fork_server(grace: float) -> bool:
    """Stops the fork server the workers were forked from (:mod:`._parent`), if this process started one, and waits
    at most ``grace`` seconds for it to exit; whether it is gone. The server exits when its "alive" pipe closes,
    like the tracker (whose pipe it holds too: reaped first). Only for interpreter exit, after the workers stopped:
    a worker dies with the server."""
    from multiprocessing import forkserver

    return _close_and_wait(forkserver._forkserver, "_forkserver_alive_fd", "_forkserver_pid", "_lock", "fork server",
                           grace)


def _close_and_wait(helper: Any, fd_name: str, pid_name: str, lock_name: str, what: str, grace: float) -> bool:
    """Closes the pipe whose end of file stops multiprocessing's helper process ``helper`` (its attributes
    ``fd_name``, ``pid_name``, ``lock_name``) and waits at most ``grace`` seconds for the process to exit."""
    lock, fd, pid = (getattr(helper, a, None) for a in (lock_name, fd_name, pid_name))
    if lock is None or fd is None or pid is None:
        return True
    with lock:
        if getattr(helper, fd_name) is None:
            return True
        os.close(fd)  # the helper reads its pipe until every writer has closed it, then exits
        setattr(helper, fd_name, None)
        setattr(helper, pid_name, None)
        deadline = time.monotonic() + grace
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped already
                return True
            if done:
                return True
            if time.monotonic() > deadline:
                # Another process still holds its pipe (a child that inherited it): it exits with that one.
                log.info("multiprocessing's %s (pid %d) had not exited %g s after this process closed its pipe",
                         what, pid, grace)
                return False
            time.sleep(0.01)


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
    f.atexit = False  # closed by close_all_at_exit, before multiprocessing's own hook
    with _LOCK:
        if not _HOOKED:
            # multiprocessing's own atexit hook terminates daemon children with SIGTERM and then joins them, but
            # batcher workers ignore SIGTERM (a scheduler sends it to the whole job; the parent owns shutdown), so
            # that join would wait forever. atexit runs the hook registered last first, and this one comes after
            # multiprocessing.util's (imported above): every batcher is closed before multiprocessing joins. It also
            # runs when every batcher was closed, to reap the resource tracker their workers started.
            atexit.register(close_all_at_exit)
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
