"""The replay buffer of an off-policy run: its settings turned into a buffer, and a buffer that cannot fit in memory
refused before anything starts.
"""

from __future__ import annotations

import pathlib

import torch

from rlstruct.algos._replay_storage import available_memory
from rlstruct.algos._train.config import OffPolicyConfig
from rlstruct.algos._train.env_spec import EnvSpec
from rlstruct.algos.replay import PrioritizedReplayBuffer, ReplayBuffer
from rlstruct.errors import ConfigError

__all__ = ["check_replay_fits", "make_replay_buffer"]

_GB = 1e9


def _buffer_class(config: OffPolicyConfig) -> type[ReplayBuffer]:
    return PrioritizedReplayBuffer if config.prioritized_replay else ReplayBuffer


def check_replay_fits(config: OffPolicyConfig, spec: EnvSpec, device: torch.device,
                      available: int | None = None) -> None:
    """Raises :class:`~rlstruct.errors.ConfigError` when the replay buffer of ``config`` kept in the CPU's memory
    needs more than the machine has available (``available`` bytes; ``None``: :func:`available_memory`), in one line:
    what it needs, what there is, and the fix. Nothing is allocated.

    >>> spec = EnvSpec((4, 84, 84), "uint8", 4, 1000)  # Atari's stacked frames, each frame stored once
    >>> check_replay_fits(OffPolicyConfig(buffer_size=10**6), spec, torch.device("cpu"), available=4 * 10**9)
    Traceback (most recent call last):
    ...
    rlstruct.errors.ConfigError: --buffer-size 1000000 needs 8.3 GB for the replay buffer (8252 bytes per transition \
x 1000000 transitions), this machine has 4.0 GB available; pass a smaller --buffer-size (at most 484752 fits) or \
--replay-storage disk
    """
    if config.replay_storage != "memory" or device.type != "cpu":
        return
    available = available_memory() if available is None else available
    if available is None:
        return
    cls = _buffer_class(config)
    needed = cls.planned_nbytes(spec, config.buffer_size)
    if needed <= available:
        return
    per = needed / config.buffer_size
    fits = int(available / per)
    raise ConfigError(
        f"--buffer-size {config.buffer_size} needs {needed / _GB:.1f} GB for the replay buffer ({per:.0f} bytes per "
        f"transition x {config.buffer_size} transitions), this machine has {available / _GB:.1f} GB available; pass a "
        f"smaller --buffer-size (at most {fits} fits) or --replay-storage disk"
    )


def make_replay_buffer(config: OffPolicyConfig, spec: EnvSpec, device: torch.device, *, seed: int,
                       folder: pathlib.Path, rank: int = 0) -> ReplayBuffer:
    """The run's replay buffer: prioritized or uniform, in memory or in files under ``folder/replay`` (one folder
    per rank of a data-parallel run)."""
    kwargs: dict = {"storage": config.replay_storage}
    if config.replay_storage == "disk":
        kwargs["folder"] = folder / ("replay" if rank == 0 else f"replay-rank{rank}")
    if config.prioritized_replay:
        kwargs.update(alpha=config.priority_alpha, beta0=config.priority_beta0)
    return _buffer_class(config).for_spec(spec, config.buffer_size, device, seed=seed, **kwargs)
