"""Whether a process of this machine is still running, and the identity that records name their owner by (a
disk-backed replay buffer's folder, a sweep's trials): the host, the PID namespace, the pid and the process's start
time, so that a container beside this one on the same host (same hostname, other PID namespace) and a later process
given the same pid are never taken for the owner."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["owner_gone", "pid_namespace", "process_alive", "process_identity", "process_start"]


def process_alive(pid: int) -> bool:
    """Whether the process ``pid`` runs on this machine: it exists and is no zombie (ended, not yet reaped). Another
    user's process counts as running.

    >>> process_alive(os.getpid()), process_alive(0)
    (True, False)
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (macOS): kill's answer stands
        return True


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot, ``/proc/PID/stat``), or ``None`` where the system
    does not say: with the pid, it names one process, not a later one given the same pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_namespace() -> int | None:
    """The inode of this process's PID namespace (``/proc/self/ns/pid``), unique on its host while the namespace
    lives: two containers on one host have the same hostname and other namespaces. ``None`` where the system does
    not say (no ``/proc``)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def process_identity(pid: int | None = None) -> dict[str, Any]:
    """The record that names process ``pid`` (default: this one) as an owner: ``{"host", "pid_ns", "pid",
    "start"}`` (JSON-ready); :func:`owner_gone` reads it.

    >>> sorted(process_identity())
    ['host', 'pid', 'pid_ns', 'start']
    """
    pid = os.getpid() if pid is None else pid
    return {"host": socket.gethostname(), "pid_ns": pid_namespace(), "pid": pid, "start": process_start(pid)}


def owner_gone(owner: Mapping[str, Any]) -> bool:
    """Whether the process a :func:`process_identity` record names has provably ended: it is of this host and this
    PID namespace, and its pid runs no process, or a later one (another start time). A process of another machine
    or of another PID namespace (a container beside this one) cannot be seen from here, so it is not provably gone:
    a record's owner there says it is alive another way (a heartbeat). A record without ``pid_ns`` (written before
    it was kept) counts as of this namespace.

    >>> owner_gone(process_identity()), owner_gone({**process_identity(), "pid_ns": -1, "pid": 0})
    (False, False)
    >>> owner_gone({**process_identity(), "pid": 0})
    True
    """
    if owner.get("host") != socket.gethostname():
        return False
    namespace = owner.get("pid_ns")
    if namespace is not None and namespace != pid_namespace():
        return False
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or not process_alive(pid):
        return True
    start = owner.get("start")
    return start is not None and process_start(pid) not in (None, start)
