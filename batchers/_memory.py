"""Output allocation for the batchers' copies out of their buffers.

Each ``get`` hands out fresh tensors (the buffer is overwritten by the next ``execute``). On Linux a large
fresh allocation is new virtual memory, so its first write costs one page fault per 4 KiB page: at 16384
envs x 128 steps, about 37,000 faults per ``get``, half its time. Asking the kernel for transparent huge
pages on those allocations (what torch itself does for every allocation with ``THP_MEM_ALLOC_ENABLE=1``)
cuts that to one fault per 2 MiB. Elsewhere, or where the kernel says no, nothing changes but the speed.
"""

from __future__ import annotations

import ctypes
import sys

import torch

__all__ = ["empty_output"]

_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14
# Below this a tensor spans few huge pages: not worth a system call.
_MIN_BYTES = 4 * _HUGE_PAGE


def _load_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise  # libc, already loaded by the interpreter
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_madvise = _load_madvise()


def empty_output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``, backed by transparent huge pages where it is large,
    on the CPU, and the kernel allows it (``madvise(MADV_HUGEPAGE)`` before the first write)."""
    x = torch.empty(shape, dtype=dtype, device=device)
    nbytes = x.numel() * x.element_size()
    if _madvise is not None and device.type == "cpu" and nbytes >= _MIN_BYTES:
        start = x.data_ptr()
        first = (start + _HUGE_PAGE - 1) // _HUGE_PAGE * _HUGE_PAGE
        length = (start + nbytes - first) // _HUGE_PAGE * _HUGE_PAGE
        if length > 0:
            _madvise(first, length, _MADV_HUGEPAGE)  # advice only: a refusal (EINVAL, ENOMEM) changes nothing
    return x
