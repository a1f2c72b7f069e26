"""The C allocator's settings in the processes rlstruct runs experience collection in.

A policy's forward over thousands of envs allocates intermediates of a few MiB (``[4096, 64]`` float32 is 1 MiB).
glibc serves an allocation above its mmap threshold (128 KiB in a fresh process) with a fresh ``mmap`` and returns
it with ``munmap`` at the free, so each forward pays page faults on every intermediate. glibc raises the threshold
by itself ("dynamic threshold") the first time a larger mmapped block is freed, so a process's speed came to depend
on what it happened to free before: the same batcher ran at 0.68x in one fresh process and 1.4x in another.
:func:`tune_allocator` fixes the threshold instead (``mallopt(M_MMAP_THRESHOLD)``, with the trim threshold above it,
which is what glibc's ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` environment variables do at start-up):
blocks below it are reused from the heap, and the heap is still given back to the system above the trim threshold.

rlstruct calls it in the processes it owns (batcher worker processes, the ``rlstruct`` command) and when an
in-process batcher starts. Set ``RLSTRUCT_TUNE_MALLOC=0`` to leave the allocator alone; on a libc other than glibc
(musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_allocator"]

log = logging.getLogger(__name__)

#: bytes: blocks below this come from the heap (glibc's largest dynamic threshold on 64-bit systems)
MMAP_THRESHOLD = 32 * 1024 * 1024
#: bytes of free memory at the top of the heap past which glibc gives it back to the system
TRIM_THRESHOLD = 256 * 1024 * 1024

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_tuned = False


def tune_allocator() -> bool:
    """Fixes glibc's mmap and trim thresholds in this process (once; later calls do nothing).

    Returns:
        Whether the thresholds are set in this process: ``False`` where the C library is not glibc, where
        ``RLSTRUCT_TUNE_MALLOC=0``, or where glibc's own environment variables already set them.
    """
    global _tuned
    if _tuned:
        return True
    if os.environ.get("RLSTRUCT_TUNE_MALLOC", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False  # the user's own setting, applied by glibc at start-up
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; the trim threshold first, so the heap never trims below the new mmap threshold.
    _tuned = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    log.debug("glibc mmap threshold %d, trim threshold %d: %s", MMAP_THRESHOLD, TRIM_THRESHOLD, _tuned)
    return _tuned
