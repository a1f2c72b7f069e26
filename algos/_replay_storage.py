"""Where the replay buffer keeps its observations: whole, or as stacked frames each stored once, in memory or in
memory-mapped files; and what a buffer of a given size needs against what the machine has.

An observation store holds observations by number (observation ``k`` at row ``k % rows``) and rebuilds them on
:meth:`read`; the buffer above it numbers the observations and says which are still referenced.

On disk, every file's blocks are reserved when it is made (``posix_fallocate``), so that a full disk is an error at
that moment rather than a SIGBUS at a later page write; a folder of files holds an owner file naming the process
that made them, so that the files of a process that died without removing them (SIGKILL) are reclaimed by the next
buffer that looks there (:func:`reclaim_stale`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import pathlib
import shutil
import tempfile
import weakref
from collections.abc import Iterable

import numpy as np
import torch

from rlstruct._processes import owner_gone, process_identity
from rlstruct.algos._train.durable import make_folder, open_unlinked
from rlstruct.errors import ConfigError, DiskSpaceError

log = logging.getLogger(__name__)

#: the choices of ``storage``: tensors in memory, or memory-mapped files on disk
STORAGES = ("memory", "disk")
#: the file of a folder of replay files that names the process owning them: ``{"host": ..., "pid": ..., "start": ...}``
OWNER_FILE = "owner.json"
#: the prefix of the temporary folders of buffers given no folder
TEMP_PREFIX = "replay-"
_GB = 1e9


def _owner_record() -> dict:
    """This process's owner file."""
    return process_identity()


def _owner_alive(owner: dict) -> bool:
    """Whether the process an owner file names may be running: the same process (same pid, same start time), or
    one of another machine or another PID namespace (a folder shared over the network, or with a container beside
    this one), which this one cannot see."""
    return not owner_gone(owner)


def _read_owner(folder: pathlib.Path) -> dict | None:
    try:
        owner = json.loads((folder / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else {}


def reclaim_stale(folders: Iterable[pathlib.Path]) -> int:
    """Removes the replay files of ``folders`` whose owner process is no longer running (killed before it could
    remove them); logs one line with the bytes reclaimed when there were any.

    A folder without an owner file is left as it is; a temporary folder of a buffer (``replay-*``) is removed whole.

    Returns:
        the bytes of the files removed.
    """
    reclaimed, removed = 0, []
    for folder in folders:
        owner = _read_owner(folder)
        if owner is None or _owner_alive(owner):
            continue
        files = [p for p in folder.glob("*.bin") if p.is_file()]
        for path in files:
            with contextlib.suppress(OSError):  # removed by someone else meanwhile
                reclaimed += path.stat().st_blocks * 512
                path.unlink()
        (folder / OWNER_FILE).unlink(missing_ok=True)
        if folder.name.startswith(TEMP_PREFIX) and folder.parent == pathlib.Path(tempfile.gettempdir()):
            shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    if reclaimed:
        log.info("reclaimed %.2f GB of replay files that killed runs left in %s", reclaimed / _GB, ", ".join(removed))
    return reclaimed


def stale_candidates(folder: pathlib.Path | None) -> list[pathlib.Path]:
    """The folders where a buffer with files in ``folder`` (``None``: a temporary folder) looks for what killed
    runs left: ``folder``, the replay folders of the run folders beside its run folder (``runs/*/replay*``: a rerun
    of a killed run writes to ``DIR-2``), and the temporary folders of buffers given no folder."""
    found = []
    if folder is not None:
        found += [folder, *(p.parent for p in folder.parent.parent.glob(f"*/replay*/{OWNER_FILE}"))]
    found += [p.parent for p in pathlib.Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*/{OWNER_FILE}")]
    return list(dict.fromkeys(found))


def free_bytes(folder: pathlib.Path) -> int:
    """The bytes free for this process on the disk of ``folder`` (of its nearest existing parent)."""
    path = folder.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def _reserve(path: pathlib.Path, nbytes: int) -> None:
    """Makes ``path`` a file of ``nbytes`` zero bytes whose blocks the disk has given (so that a write through a
    memory map of it cannot fail for space).

    Raises:
        DiskSpaceError: the disk has not the room.
    """
    fd = open_unlinked(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            # A file system without fallocate (glibc emulates it on most): the zeros written take the blocks.
            chunk = bytes(1 << 24)
            for start in range(0, nbytes, len(chunk)):
                os.pwrite(fd, chunk[:min(len(chunk), nbytes - start)], start)
    except OSError as e:
        os.close(fd)
        path.unlink(missing_ok=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskSpaceError(
                f"the replay buffer needs {nbytes / _GB:.2f} GB more on disk for {path} ({nbytes} bytes), the disk "
                f"has {free_bytes(path.parent) / _GB:.2f} GB free; free disk space, pass a smaller --buffer-size, or "
                "--replay-storage memory") from None
        raise
    os.close(fd)


def _unlink(paths: list[pathlib.Path], folder: pathlib.Path | None, own_folder: bool) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
    if folder is not None:
        (folder / OWNER_FILE).unlink(missing_ok=True)
        if own_folder:
            shutil.rmtree(folder, ignore_errors=True)


class Allocator:
    """Allocates the buffer's tensors in memory, or, with ``storage="disk"``, as memory-mapped files in
    ``folder`` (a fresh temporary folder when ``None``), whose files :meth:`close` removes, with the folder when it
    made it (also at garbage collection).

    On disk, each file's blocks are reserved as it is made, and the folder holds an owner file (:data:`OWNER_FILE`)
    naming this process; the files a killed owner left there, or in the other places of :func:`stale_candidates`,
    are removed first (:func:`reclaim_stale`).

    Args:
        device: where the tensors live (``disk`` storage needs the CPU).
        storage: ``"memory"`` or ``"disk"``.
        folder: the files' folder (created if missing).

    Raises:
        ValueError: an unknown ``storage``, or ``disk`` off the CPU.
        ConfigError: ``folder`` holds the replay files of another process that is running.
        RunFileLinkError: ``folder``, or a file the buffer writes in it, is a symbolic link.
        DiskSpaceError: (from :meth:`zeros`) the disk has not the room for a file.

    >>> alloc = Allocator("cpu", storage="disk")
    >>> t = alloc.zeros((2, 3), torch.uint8, "frames")
    >>> t.sum().item(), alloc.paths[0].name
    (0, 'frames-0.bin')
    >>> folder = alloc.folder
    >>> alloc.close()
    >>> folder.exists()
    False
    """

    def __init__(self, device: torch.device | str, *, storage: str = "memory", folder: str | os.PathLike | None = None):
        if storage not in STORAGES:
            raise ValueError(f"storage must be one of {list(STORAGES)}, got {storage!r}")
        self.device = torch.device(device)
        if storage == "disk" and self.device.type != "cpu":
            raise ValueError(f"disk storage maps files into the CPU's memory, got device {self.device}; keep the "
                             "buffer on the CPU or use storage='memory'")
        self.storage = storage
        own = storage == "disk" and folder is None  # a temporary folder of its own, removed with the files
        self.folder = None if storage == "memory" else pathlib.Path(folder or tempfile.mkdtemp(prefix=TEMP_PREFIX))
        self.paths: list[pathlib.Path] = []
        self._count = 0
        if self.folder is not None:
            self._claim(self.folder, None if own else self.folder)
        self._finalizer = weakref.finalize(self, _unlink, self.paths, self.folder, own)

    @staticmethod
    def _claim(folder: pathlib.Path, given: pathlib.Path | None) -> None:
        """Reclaims what killed owners left, then writes this process's owner file into ``folder`` (``given``: the
        folder the caller named, ``None`` for a temporary one)."""
        owner = _read_owner(folder)
        if owner is not None and owner != _owner_record() and _owner_alive(owner):
            raise ConfigError(f"replay folder {str(folder)!r} holds the replay files of process "
                                    f"{owner.get('pid')}, which is running; give this buffer another folder (another "
                                    "--logdir), or stop that process")
        reclaim_stale(stale_candidates(given))
        make_folder(folder)  # neither the folder nor a file in it written through a symbolic link
        with os.fdopen(open_unlinked(folder / OWNER_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
            f.write(json.dumps(_owner_record()))

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype, name: str) -> torch.Tensor:
        """A zeroed tensor of ``shape``; on disk, a file ``{name}-{k}.bin`` mapped into memory."""
        if self.folder is None:
            return _zeros_in_memory(shape, dtype, self.device)
        path = self.folder / f"{name}-{self._count}.bin"
        self._count += 1
        numel = math.prod(shape)
        _reserve(path, numel * torch.empty((), dtype=dtype).element_size())
        self.paths.append(path)
        return torch.from_file(str(path), shared=True, size=numel, dtype=dtype).view(shape)

    def release(self, tensor: torch.Tensor) -> None:
        """Removes the file of a tensor replaced by a grown one (the mapping lives until the tensor is freed)."""
        if self.folder is None:
            return
        filename = tensor.untyped_storage().filename
        for path in list(self.paths):
            if filename is not None and str(path) == filename:
                path.unlink(missing_ok=True)
                self.paths.remove(path)

    def close(self) -> None:
        """Removes the files (idempotent)."""
        self._finalizer()


class WholeObservations:
    """Each observation stored whole: ``rows`` observations of ``obs_shape`` in one ring.

    >>> store = WholeObservations(4, (2,), torch.float32, Allocator("cpu"))
    >>> store.write(torch.tensor([0, 1]), torch.ones(2, 2), torch.tensor([-1, 0]), torch.zeros(2, 2), 0)
    >>> store.read(torch.tensor([1])).tolist()
    [[1.0, 1.0]]
    """

    def __init__(self, rows: int, obs_shape: tuple[int, ...], dtype: torch.dtype, alloc: Allocator):
        self.obs_shape, self.alloc = obs_shape, alloc
        self.obs = alloc.zeros((rows, *obs_shape), dtype, "observations")

    @property
    def rows(self) -> int:
        """Observations the ring holds."""
        return self.obs.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The stored dtype."""
        return self.obs.dtype

    def nbytes(self) -> int:
        """Bytes held."""
        return self.obs.element_size() * self.obs.numel()

    def write(self, numbers: torch.Tensor, obs: torch.Tensor, parent: torch.Tensor, parent_obs: torch.Tensor,
              live_from: int) -> None:
        """Writes observations ``numbers`` (``int64 [K]``, consecutive); the parents are ignored."""
        self.obs[numbers % self.rows] = obs.to(self.obs.device, self.obs.dtype)

    def read(self, numbers: torch.Tensor) -> torch.Tensor:
        """The observations ``numbers`` (``int64 [N]``), ``[N, *obs_shape]`` in the stored dtype."""
        return self.obs.index_select(0, numbers % self.rows)

    def grow(self, rows: int, live: torch.Tensor) -> None:
        """Grows the ring to ``rows``, keeping the observations ``live`` (``int64 [K]``)."""
        old = self.obs
        self.obs = self.alloc.zeros((rows, *self.obs_shape), old.dtype, "observations")
        self.obs[live % rows] = old[live % old.shape[0]]
        self.alloc.release(old)


class StackedFrames:
    """Observations that are stacks of ``S`` frames (``[S, *frame_shape]``, the stack on the first axis), each frame
    stored once.

    An observation is ``S`` numbers into a ring of frames (``table [rows, S]``). One whose first ``S - 1`` frames are
    its parent's last ``S - 1`` (the env shifted its stack by one step) writes one frame; any other (the first of an
    episode, whatever the env stacked at its reset) writes its ``S`` frames. :meth:`read` is therefore exactly what
    was written, whatever the env's stacking does at a reset. The frames of one :meth:`write` are laid out in its
    order, so that a chain of observations that each continue the one before has its frames consecutive.

    Args:
        rows: observations the table holds.
        obs_shape: ``(S, *frame_shape)``.
        dtype: the frames' dtype.
        alloc: where the table and the frames live.
        frame_rows: frames the ring holds at first (grown when the frames of the live observations would not fit).

    >>> store = StackedFrames(8, (3, 2), torch.uint8, Allocator("cpu"), frame_rows=16)
    >>> obs = torch.tensor([[[0, 0], [0, 0], [1, 1]], [[0, 0], [1, 1], [2, 2]]], dtype=torch.uint8)
    >>> store.write(torch.tensor([0, 1]), obs, torch.tensor([-1, 0]), torch.roll(obs, 1, 0), 0)
    >>> store.n_frames, torch.equal(store.read(torch.tensor([0, 1])), obs)
    (4, True)
    """

    def __init__(self, rows: int, obs_shape: tuple[int, ...], dtype: torch.dtype, alloc: Allocator, *,
                 frame_rows: int):
        self.obs_shape, self.alloc = obs_shape, alloc
        self.stack = obs_shape[0]
        self.table = alloc.zeros((rows, self.stack), torch.int64, "frame-numbers")
        self.frames = alloc.zeros((frame_rows, *obs_shape[1:]), dtype, "frames")
        self.n_frames = 0  # frames written so far (the next frame's number)
        self._floor = 0  # no live observation points to a frame below this number

    @property
    def rows(self) -> int:
        """Observations the table holds."""
        return self.table.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        """The stored dtype."""
        return self.frames.dtype

    def nbytes(self) -> int:
        """Bytes held."""
        return sum(t.element_size() * t.numel() for t in (self.table, self.frames))

    def write(self, numbers: torch.Tensor, obs: torch.Tensor, parent: torch.Tensor, parent_obs: torch.Tensor,
              live_from: int) -> None:
        """Writes observations ``numbers`` (``int64 [K]``, consecutive, in the order of their chains).

        Args:
            numbers: the observations' numbers.
            obs: ``[K, S, *frame_shape]``.
            parent: ``int64 [K]``, the number of the observation each one follows in its env (-1: none): an earlier
                observation of this write must be the one just before it; an observation of an earlier write must
                still be live.
            parent_obs: ``[K, S, *frame_shape]``, the parents' observations (any value where there is none).
            live_from: the lowest observation number still referenced.
        """
        dev, S, K = self.frames.device, self.stack, numbers.shape[0]
        if K == 0:
            return
        obs = obs.to(dev, self.frames.dtype)
        parent = parent.to(dev)
        same = (obs[:, :-1] == parent_obs.to(dev, self.frames.dtype)[:, 1:]).flatten(1).all(1)
        continues = (parent >= 0) & same
        count = torch.where(continues, 1, S)  # frames each observation writes
        last = self.n_frames + torch.cumsum(count, 0) - 1  # each one's newest frame
        # A segment: a fresh observation (its own S frames) or one that continues an earlier write's, and the
        # observations that continue it after.
        starts = ~continues | (parent < numbers[0])
        k = torch.arange(K, device=dev)
        seg = torch.cummax(torch.where(starts, k, -1), 0).values
        seg_first = last[seg] - count[seg] + 1
        before = self.table[parent[seg].clamp(min=0) % self.rows]  # the frames of a segment's parent
        back = torch.arange(S - 1, -1, -1, device=dev)  # slot i of a stack is `back[i]` frames before the newest
        at = last[:, None] - back
        inside = at >= seg_first[:, None]
        behind = (S - 1 - (seg_first[:, None] - at - 1)).clamp(0, S - 1)
        ids = torch.where(inside, at, before.gather(1, behind))
        own = back < count[:, None]  # the frames this write adds: all S of a fresh one, the newest of the others
        new_frames = int(last[-1]) + 1 - self.n_frames  # the write's one host read
        self._reserve(new_frames, numbers, live_from)
        self.frames[at[own] % self.frames.shape[0]] = obs[own]
        self.table[numbers % self.rows] = ids
        self.n_frames += new_frames

    def _reserve(self, new_frames: int, numbers: torch.Tensor, live_from: int) -> None:
        """Grows the frame ring when writing ``new_frames`` would overwrite a frame a live observation points to."""
        rows = self.frames.shape[0]
        if self.n_frames + new_frames - self._floor <= rows:
            return
        first = int(numbers[0])
        if first > live_from:  # the floor only rises: no live observation is written with frames below it
            live = torch.arange(live_from, first, device=self.table.device) % self.rows
            self._floor = max(self._floor, int(self.table[live, 0].min()))
        else:
            self._floor = self.n_frames
        needed = self.n_frames + new_frames - self._floor
        if needed <= rows:
            return
        grown = max(needed, rows + rows // 8)
        log.info("the replay buffer's frame ring grows from %d to %d frames to keep the frames of its observations",
                 rows, grown)
        old = self.frames
        self.frames = self.alloc.zeros((grown, *old.shape[1:]), old.dtype, "frames")
        kept = torch.arange(max(self._floor, self.n_frames - rows), self.n_frames, device=old.device)
        self.frames[kept % grown] = old[kept % rows]
        self.alloc.release(old)

    def read(self, numbers: torch.Tensor) -> torch.Tensor:
        """The observations ``numbers`` (``int64 [N]``), ``[N, S, *frame_shape]`` in the stored dtype."""
        # index_select over a flat index: a fraction of the cost of advanced indexing's gather
        ids = self.table.index_select(0, numbers % self.rows).flatten() % self.frames.shape[0]
        return self.frames.index_select(0, ids).view(numbers.shape[0], *self.obs_shape)

    def grow(self, rows: int, live: torch.Tensor) -> None:
        """Grows the table to ``rows``, keeping the observations ``live`` (``int64 [K]``)."""
        old = self.table
        self.table = self.alloc.zeros((rows, self.stack), torch.int64, "frame-numbers")
        self.table[live % rows] = old[live % old.shape[0]]
        self.alloc.release(old)


def default_obs_rows(capacity: int, *, pairs: bool = False) -> int:
    """The observations a buffer of ``capacity`` transitions holds at first: one per transition, the terminal ones
    of episodes longer than 32 steps and those of a push or two; with ``pairs``, twice as many (two per transition,
    and the transitions of a push or two whose first ones are overwritten).

    >>> default_obs_rows(1000), default_obs_rows(1000, pairs=True)
    (1095, 2190)
    """
    rows = capacity + capacity // 32 + 64
    return 2 * rows if pairs else rows


def default_frame_rows(obs_rows: int, stack: int) -> int:
    """The frames a :class:`StackedFrames` of ``obs_rows`` observations holds at first: one per observation, an
    eighth more for the stacks of episode starts, and two stacks."""
    return obs_rows + obs_rows // 8 + 2 * stack


def store_nbytes(rows: int, obs_shape: tuple[int, ...], dtype: torch.dtype, frame_stack: bool) -> int:
    """The bytes of a store of ``rows`` observations as first allocated (``frame_stack``: a :class:`StackedFrames`).

    >>> store_nbytes(100, (4, 84, 84), torch.uint8, True) == StackedFrames(
    ...     100, (4, 84, 84), torch.uint8, Allocator("cpu"), frame_rows=default_frame_rows(100, 4)).nbytes()
    True
    """
    size = torch.empty((), dtype=dtype).element_size()
    if not frame_stack:
        return rows * math.prod(obs_shape) * size
    stack = obs_shape[0]
    return default_frame_rows(rows, stack) * math.prod(obs_shape[1:]) * size + rows * stack * 8


def is_frame_stack(obs_shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Whether observations of ``obs_shape`` and ``dtype`` are taken for stacked frames (``uint8 [S, H, W]``, a few
    frames of larger images, as the Atari preprocessing gives them).

    >>> is_frame_stack((4, 84, 84), torch.uint8), is_frame_stack((10, 10, 4), torch.uint8)
    (True, False)
    """
    return (dtype == torch.uint8 and len(obs_shape) == 3 and 1 < obs_shape[0] < min(obs_shape[1:])
            and min(obs_shape[1:]) >= 16)


def available_memory() -> int | None:
    """The bytes the machine can give a new allocation (``MemAvailable`` of ``/proc/meminfo``, else psutil's),
    or ``None`` where neither says."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def _zeros_in_memory(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.zeros``; on the CPU, numpy's ``calloc`` pages, which the OS zeroes when first written: a buffer of a
    million Atari transitions (8 GB) is there at once and takes memory as it fills, where ``torch.zeros`` writes
    every byte first (11 s for 8 GB here). A dtype numpy lacks (bfloat16) falls back to ``torch.zeros``.

    >>> t = _zeros_in_memory((2, 3), torch.uint8, torch.device("cpu"))
    >>> t.dtype, bool((t == 0).all()), t.is_contiguous()
    (torch.uint8, True, True)
    """
    if device.type == "cpu":
        try:
            np_dtype = torch.empty((), dtype=dtype).numpy().dtype
        except TypeError:
            np_dtype = None
        if np_dtype is not None:
            return torch.from_numpy(np.zeros(shape, dtype=np_dtype))
    return torch.zeros(shape, dtype=dtype, device=device)
