"""Whether a process of this machine is still running, for the files and records that name their owner's pid (a
disk-backed replay buffer's folder, a sweep's trials)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["process_alive"]


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
