"""The trajectory buffer, for the parent and the workers alike: its layout, allocation, rows, and copy-out.

A buffer is a flat ``{key: tensor}``: temporal keys (``observation/*``, ``action/*``, ``_observation/*``)
are time-major ``[T, B, ...]``, per-row keys (``agent_info/*``, ``env_info/*``, ``agent_state/*``) are
``[B, ...]``, and ``lengths`` is ``int64 [B]``. A worker writes its rows of it (:func:`rows_of`); ``get``
copies it out batch-major (:func:`gather`) or hands out views (:func:`views_of`); either becomes
Trajectories through :func:`trajectories_from`.
"""

from __future__ import annotations

import ctypes
import shutil
import sys
from collections.abc import Iterable

import torch

from rlstruct.errors import ConfigError
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories

__all__ = [
    "INFO_PREFIXES",
    "TEMPORAL_PREFIXES",
    "Specs",
    "allocate_block",
    "copy_batch_major",
    "empty_output",
    "foreach_copy",
    "gather",
    "rows_of",
    "share",
    "specs_of",
    "trajectories_from",
    "views_of",
]

# name -> (per-row shape, dtype)
Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]

TEMPORAL_PREFIXES = ("observation/", "action/", "_observation/")
INFO_PREFIXES = ("agent_info/", "env_info/", "agent_state/")


def specs_of(d: DictTensor, prefix: str) -> Specs:
    """The buffer specs of the keys of ``d`` under ``prefix``: ``{prefix + key: (row shape, dtype)}``."""
    return {prefix + k: (tuple(v.shape[1:]), v.dtype) for k, v in d.items()}


def allocate_block(
    specs: Specs, n_rows: int, n_timesteps: int, device: torch.device, shared: bool
) -> dict[str, torch.Tensor]:
    """Zero buffers: ``[n_timesteps, n_rows, ...]`` per temporal key, ``[n_rows, ...]`` per info key, and
    ``lengths: int64 [n_rows]``; in shared memory when ``shared`` (CPU).

    Temporal buffers are time-major so that the write of one step is one contiguous block (batch-major
    storage would scatter every step over ``n_rows`` cache lines per key); ``get`` transposes once.

    >>> block = allocate_block({"observation/x": ((3,), torch.float32), "agent_info/t": ((), torch.float32)},
    ...                        n_rows=4, n_timesteps=2, device=torch.device("cpu"), shared=False)
    >>> {k: list(v.shape) for k, v in block.items()}
    {'observation/x': [2, 4, 3], 'agent_info/t': [4], 'lengths': [4]}
    """
    block: dict[str, torch.Tensor] = {}
    for name, (shape, dtype) in specs.items():
        lead = (n_timesteps, n_rows) if name.startswith(TEMPORAL_PREFIXES) else (n_rows,)
        block[name] = torch.zeros(lead + tuple(shape), dtype=dtype, device=device)
    block["lengths"] = torch.zeros(n_rows, dtype=torch.int64, device=device)
    if shared:
        share(block.values(), "the batcher's trajectory buffer")
    return block


#: where the shared memory of worker processes lives (Linux)
SHM_FOLDER = "/dev/shm"


def share(tensors: Iterable[torch.Tensor], what: str) -> None:
    """Moves CPU ``tensors`` into shared memory, for worker processes to write.

    Raises:
        ConfigError: the shared memory cannot hold them (a ``/dev/shm`` too small, as containers have by default, or
            read-only): the message names the bytes asked, what ``/dev/shm`` has free, and the fixes.
    """
    tensors = list(tensors)
    try:
        for v in tensors:
            v.share_memory_()
    except RuntimeError as e:  # torch's "unable to write to file </torch_...>: No space left on device (28)"
        asked = sum(v.numel() * v.element_size() for v in tensors)
        try:
            usage = shutil.disk_usage(SHM_FOLDER)
            room = f"{SHM_FOLDER} has {usage.free / 1e6:,.1f} MB free of {usage.total / 1e6:,.1f} MB"
        except OSError:
            room = f"{SHM_FOLDER} cannot be read"
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"shared memory for {what} ({asked / 1e6:,.1f} MB) cannot be made: {reason}; {room}. Use "
                          "fewer envs or steps per acquisition, no worker processes (n_processes=0), or a larger "
                          f"{SHM_FOLDER} (e.g. docker run --shm-size=8g)") from None


def rows_of(block: dict[str, torch.Tensor], start: int, n: int) -> dict[str, torch.Tensor]:
    """Rows ``start:start + n`` of every buffer of ``block`` (views: dim 1 of temporal keys, dim 0 of the others)."""
    rows = slice(start, start + n)
    return {k: v[:, rows] if k.startswith(TEMPORAL_PREFIXES) else v[rows] for k, v in block.items()}


def foreach_copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """``d.copy_(s)`` for every pair, in one call where torch has ``_foreach_copy_``."""
    if not dst:
        return
    if _FOREACH_COPY is not None:
        _FOREACH_COPY(dst, src)
    else:
        for d, s in zip(dst, src):
            d.copy_(s)


_FOREACH_COPY = getattr(torch, "_foreach_copy_", None)

# Word types to move whole rows with, widest first (copies only: no arithmetic touches the bits).
_WORDS = ((16, torch.complex128), (8, torch.int64), (4, torch.int32), (2, torch.int16))


def _rows_as_words(x: torch.Tensor, lead: int) -> torch.Tensor | None:
    """``x`` viewed as ``[*x.shape[:lead], W]`` of the widest word type that tiles a row's bytes, squeezed to
    ``x.shape[:lead]`` when one word holds a row; ``None`` when that would not move fewer, wider elements.
    The dims from ``lead`` on must be contiguous."""
    k = x.shape[lead:].numel()
    row = k * x.element_size()
    for size, word in _WORDS:
        if row % size == 0:
            if size <= x.element_size() or k == 0:
                return None
            words = x.reshape(x.shape[:lead] + (k,)).view(torch.uint8).view(word)
            return words.squeeze(-1) if row == size else words
    return None


def copy_batch_major(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst[b, t] = src[t, b]``: a time-major ``[T, B, ...]`` buffer into a contiguous ``[B, T, ...]`` tensor.

    A step's row of several small elements (``src[t, b]``, e.g. a frame of four float32) moves as one or a few
    machine words: the transposition of ``[T, B]`` words is 2x faster than an element-wise copy of ``[T, B, 4]``
    (and the same bits: nothing is computed). Rows of one element are copied as they are.

    >>> src = torch.arange(24.0).reshape(2, 3, 4)
    >>> dst = torch.empty(3, 2, 4)
    >>> copy_batch_major(dst, src)
    >>> torch.equal(dst, src.transpose(0, 1))
    True
    """
    if src.dim() > 2 and src.is_contiguous() and dst.is_contiguous() and src.dtype == dst.dtype:
        src_words, dst_words = _rows_as_words(src, 2), _rows_as_words(dst, 2)
        if src_words is not None and dst_words is not None:
            src, dst = src_words, dst_words
    dst.copy_(src.transpose(0, 1))


# Output allocation. Each ``get`` hands out fresh tensors (the buffer is overwritten by the next ``execute``). On
# Linux a large fresh allocation is new virtual memory, so its first write costs one page fault per 4 KiB page: at
# 16384 envs x 128 steps, about 37,000 faults per ``get``, half its time. Asking the kernel for transparent huge
# pages on those allocations (what torch itself does for every allocation with ``THP_MEM_ALLOC_ENABLE=1``) cuts
# that to one fault per 2 MiB. Elsewhere, or where the kernel says no, nothing changes but the speed.
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
    on the CPU, and the kernel allows it (``madvise(MADV_HUGEPAGE)`` before the first write).

    >>> empty_output((2, 3), torch.float32, torch.device("cpu")).shape
    torch.Size([2, 3])
    """
    x = torch.empty(shape, dtype=dtype, device=device)
    nbytes = x.numel() * x.element_size()
    if _madvise is not None and device.type == "cpu" and nbytes >= _MIN_BYTES:
        start = x.data_ptr()
        first = (start + _HUGE_PAGE - 1) // _HUGE_PAGE * _HUGE_PAGE
        length = (start + nbytes - first) // _HUGE_PAGE * _HUGE_PAGE
        if length > 0:
            _madvise(first, length, _MADV_HUGEPAGE)  # advice only: a refusal (EINVAL, ENOMEM) changes nothing
    return x


def views_of(block: dict[str, torch.Tensor], n_timesteps: int) -> dict[str, torch.Tensor]:
    """``block`` as batch-major views, its first ``n_timesteps`` steps: ``[B, n_timesteps, ...]`` per temporal key
    (``transpose(0, 1)`` of the time-major storage), the per-row keys as they are."""
    return {k: v[:n_timesteps].transpose(0, 1) if k.startswith(TEMPORAL_PREFIXES) else v for k, v in block.items()}


# One part of a gather: a block, the rows of it to take (``slice(None)``: all), and how many rows that is.
Part = tuple[dict[str, torch.Tensor], "slice | torch.Tensor", int]


def gather(parts: list[Part], n_timesteps: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The rows of ``parts``, one after the other, copied batch-major into fresh tensors on ``device``: one copy
    per key and part (``[B, n_timesteps, ...]`` per temporal key, ``[B, ...]`` per other key)."""
    T, B = n_timesteps, sum(n for _, _, n in parts)
    out: dict[str, torch.Tensor] = {}
    for k, v0 in parts[0][0].items():
        temporal = k.startswith(TEMPORAL_PREFIXES)
        shape = (B, T) + v0.shape[2:] if temporal else (B,) + v0.shape[1:]
        x = out[k] = empty_output(shape, v0.dtype, device)
        start = 0
        for block, rows, n in parts:
            v, dst = block[k], x[start : start + n]
            start += n
            if not temporal:
                dst.copy_(v[rows])
            elif isinstance(rows, slice):
                copy_batch_major(dst, v[:T])
            elif v.device == dst.device:
                torch.index_select(v[:T].transpose(0, 1), 0, rows, out=dst)
            else:  # a worker placed on another device than the batcher's
                dst.copy_(v[:T].transpose(0, 1)[rows])
    return out


def trajectories_from(data: dict[str, torch.Tensor]) -> Trajectories:
    """The Trajectories of a flat ``{key: tensor}`` of batch-major buffer keys (``lengths`` included; ``data``
    loses it).

    >>> data = {"observation/x": torch.zeros(2, 3), "agent_info/t": torch.ones(2), "lengths": torch.tensor([3, 1])}
    >>> traj = trajectories_from(data)
    >>> list(traj.info.keys()), list(traj.trajectories.keys()), traj.trajectories.lengths.tolist()
    (['agent_info/t'], ['observation/x'], [3, 1])
    """
    lengths = data.pop("lengths")
    info = DictTensor._trusted({k: v for k, v in data.items() if k.startswith(INFO_PREFIXES)})
    traj = TemporalDictTensor._trusted({k: v for k, v in data.items() if k.startswith(TEMPORAL_PREFIXES)}, lengths)
    return Trajectories(info, traj)
