"""The replay buffer of an off-policy run: its settings turned into a buffer, and a buffer that cannot fit in memory,
or on its disk, refused before anything starts.
"""

from __future__ import annotations

import logging
import pathlib

import torch

from rlstruct._accel import accelerator_for
from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos._replay_storage import (
    available_memory,
    free_bytes,
    is_frame_stack,
    reclaim_stale,
    stale_candidates,
)
from rlstruct.algos._train.config import OffPolicyConfig
from rlstruct.algos.replay import PrioritizedReplayBuffer, ReplayBuffer
from rlstruct.errors import ConfigError, DiskSpaceError

__all__ = ["LARGE_BUFFER_BYTES", "check_replay_fits", "make_replay_buffer", "replay_folder", "stores_pairs"]

log = logging.getLogger(__name__)

_GB = 1e9
# A buffer of more bytes than this (in memory or on disk) once full: the run says how large before any env starts.
LARGE_BUFFER_BYTES = 10**9


def _buffer_class(config: OffPolicyConfig) -> type[ReplayBuffer]:
    return PrioritizedReplayBuffer if config.prioritized_replay else ReplayBuffer


def stores_pairs(config: OffPolicyConfig, spec: EnvSpec, device: torch.device) -> bool:
    """Whether the run's buffer keeps two observations per transition (:class:`~rlstruct.algos.replay.ReplayBuffer`'s
    ``pairs``): in memory on an accelerator (the seam's, :func:`rlstruct._accel.accelerator_for`), where the one read
    on the host of a push of steps would wait for the acquisition at every iteration; not for stacked frames, which
    read their count of new frames anyway and would take several times the memory.

    >>> from rlstruct.algos._train.config import OffPolicyConfig
    >>> cartpole = EnvSpec((4,), "float32", 2, 500)
    >>> stores_pairs(OffPolicyConfig(), cartpole, torch.device("cpu")), stores_pairs(OffPolicyConfig(), cartpole,
    ...                                                                                torch.device("cuda"))
    (False, True)
    """
    frames = is_frame_stack(spec.obs_shape, getattr(torch, spec.obs_dtype))
    return config.replay_storage == "memory" and accelerator_for(device) is not None and not frames


def replay_folder(logdir: pathlib.Path, rank: int = 0) -> pathlib.Path:
    """The folder of a disk-backed replay buffer's files: ``replay`` in the run folder, one per data-parallel rank."""
    return logdir / ("replay" if rank == 0 else f"replay-rank{rank}")


def check_replay_fits(config: OffPolicyConfig, spec: EnvSpec, device: torch.device,
                      available: int | None = None, *, folder: pathlib.Path | None = None) -> None:
    """Raises :class:`~rlstruct.errors.ConfigError` when the replay buffer of ``config`` kept in the CPU's memory
    needs more than the machine has available (``available`` bytes; ``None``: :func:`available_memory`), in one line:
    what it needs, what there is, and the fix. Nothing is allocated.

    A disk-backed buffer (``replay_storage="disk"``) with files in ``folder`` first reclaims what killed runs left
    (:func:`~rlstruct.algos._replay_storage.reclaim_stale`), then raises
    :class:`~rlstruct.errors.DiskSpaceError` when its files need more than the disk there has free.

    >>> spec = EnvSpec((4, 84, 84), "uint8", 4, 1000)  # Atari's stacked frames, each frame stored once
    >>> check_replay_fits(OffPolicyConfig(buffer_size=10**6), spec, torch.device("cpu"), available=4 * 10**9)
    Traceback (most recent call last):
    ...
    rlstruct.errors.ConfigError: --buffer-size 1000000 needs 8.3 GB for the replay buffer (8252 bytes per transition \
x 1000000 transitions), this machine has 4.0 GB available; pass a smaller --buffer-size (at most 484752 fits) or \
--replay-storage disk
    """
    if config.replay_storage == "disk" and folder is not None:
        _check_disk_fits(config, spec, folder)
    if config.replay_storage != "memory" or device.type != "cpu":
        return
    available = available_memory() if available is None else available
    if available is None:
        return
    cls = _buffer_class(config)
    needed = cls.planned_nbytes(spec, config.buffer_size, pairs=stores_pairs(config, spec, device))
    if needed <= available:
        return
    per = needed / config.buffer_size
    fits = int(available / per)
    raise ConfigError(
        f"--buffer-size {config.buffer_size} needs {needed / _GB:.1f} GB for the replay buffer ({per:.0f} bytes per "
        f"transition x {config.buffer_size} transitions), this machine has {available / _GB:.1f} GB available; pass a "
        f"smaller --buffer-size (at most {fits} fits) or --replay-storage disk"
    )


def _check_disk_fits(config: OffPolicyConfig, spec: EnvSpec, folder: pathlib.Path) -> None:
    reclaim_stale(stale_candidates(folder))
    needed = _buffer_class(config).planned_disk_nbytes(spec, config.buffer_size)
    free = free_bytes(folder)
    if needed <= free:
        return
    per = needed / config.buffer_size
    raise DiskSpaceError(
        f"--buffer-size {config.buffer_size} with --replay-storage disk needs {needed / _GB:.1f} GB of disk for the "
        f"replay buffer's files ({per:.0f} bytes per transition x {config.buffer_size} transitions, {needed} bytes), "
        f"the disk of {str(folder)!r} has {free / _GB:.1f} GB free ({free} bytes); pass a smaller --buffer-size (at "
        f"most {int(free / per)} fits), free disk space, or a --logdir on a larger disk"
    )


def make_replay_buffer(config: OffPolicyConfig, spec: EnvSpec, device: torch.device, *, seed: int,
                       folder: pathlib.Path, rank: int = 0) -> ReplayBuffer:
    """The run's replay buffer: prioritized or uniform, in memory or in files under ``folder/replay`` (one folder
    per rank of a data-parallel run), two observations per transition where :func:`stores_pairs`."""
    kwargs: dict = {"storage": config.replay_storage, "pairs": stores_pairs(config, spec, device)}
    if config.replay_storage == "disk":
        kwargs["folder"] = replay_folder(folder, rank)
    _say_if_large(config, spec, device, kwargs.get("folder"))
    if config.prioritized_replay:
        kwargs.update(alpha=config.priority_alpha, beta0=config.priority_beta0)
    return _buffer_class(config).for_spec(spec, config.buffer_size, device, seed=seed, **kwargs)


def _say_if_large(config: OffPolicyConfig, spec: EnvSpec, device: torch.device, folder: pathlib.Path | None) -> None:
    """Logs one warning, before the allocation, when the buffer takes more than :data:`LARGE_BUFFER_BYTES` of memory
    or of disk once full: how much, and where (the command line shows warnings)."""
    cls = _buffer_class(config)
    total = cls.planned_nbytes(spec, config.buffer_size, pairs=stores_pairs(config, spec, device))
    disk = cls.planned_disk_nbytes(spec, config.buffer_size) if folder is not None else 0
    memory = total - disk
    if max(memory, disk) <= LARGE_BUFFER_BYTES:
        return
    where = "CPU memory" if device.type == "cpu" else f"memory of {device}"
    parts = [f"{memory / _GB:.1f} GB of {where}"]
    if folder is not None:
        parts.append(f"{disk / _GB:.1f} GB of disk in {str(folder)!r}")
    log.warning("the replay buffer of --buffer-size %d takes %s once full (%.0f bytes per transition)",
                config.buffer_size, " and ".join(parts), total / config.buffer_size)
