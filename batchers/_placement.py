"""Where a batcher worker runs: its device, the environment its process starts with, and its CPU cores."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rlstruct.devices import DeviceLike, as_device

__all__ = ["WorkerPlacement"]


@dataclass
class WorkerPlacement:
    """Where one batcher worker runs, and the environment its process starts with.

    The variables are set before the child imports torch. A CPU worker always starts with
    ``CUDA_VISIBLE_DEVICES=""``, so it can never create a CUDA context.

    Attributes:
        device: the worker's device *as the worker sees it* (a worker pinned to one GPU or MIG slice
            through ``visible_devices`` sees it as ``cuda:0``).
        visible_devices: ``CUDA_VISIBLE_DEVICES`` for the child, e.g. ``"1"`` or ``"MIG-<uuid>"``.
        mps_pipe_directory: ``CUDA_MPS_PIPE_DIRECTORY``, to share a GPU through an MPS daemon.
        mps_active_thread_percentage: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (1-100) under MPS.
        env: any other variables for the child.
        num_threads: torch intra-op threads in the child (default 1 for CPU workers, so that
            several workers do not oversubscribe the cores).
        cpus: the CPU cores the child runs on (``os.sched_setaffinity``, set before it builds its env and
            agent), e.g. ``(k,)`` for worker ``k``: one core each, so that workers neither share a core nor
            migrate between cores. ``None`` (the default): wherever the OS schedules it. Linux only.

    >>> WorkerPlacement().environment()
    {'CUDA_VISIBLE_DEVICES': ''}
    >>> WorkerPlacement("cuda:0", visible_devices="MIG-abc", mps_active_thread_percentage=50).environment()
    {'CUDA_VISIBLE_DEVICES': 'MIG-abc', 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '50'}
    """

    device: DeviceLike = "cpu"
    visible_devices: str | None = None
    mps_pipe_directory: str | None = None
    mps_active_thread_percentage: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    num_threads: int | None = None
    cpus: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        self.device = as_device(self.device)
        if self.cpus is not None:
            self.cpus = _check_cpus(self.cpus)
        p = self.mps_active_thread_percentage
        if p is not None and not (isinstance(p, int) and 1 <= p <= 100):
            raise ValueError(f"mps_active_thread_percentage must be an int in [1, 100], got {p!r}")
        if self.device.type == "cpu" and self.visible_devices:
            raise ValueError(
                f"visible_devices={self.visible_devices!r} needs a CUDA device, got device='cpu'; "
                "use device='cuda:0' (the first visible device) or drop visible_devices"
            )

    def environment(self) -> dict[str, str]:
        """The variables the child process starts with (on top of the parent's)."""
        e = {k: str(v) for k, v in self.env.items()}
        if self.device.type == "cpu":
            e["CUDA_VISIBLE_DEVICES"] = ""
        elif self.visible_devices is not None:
            e["CUDA_VISIBLE_DEVICES"] = self.visible_devices
        if self.mps_pipe_directory is not None:
            e["CUDA_MPS_PIPE_DIRECTORY"] = self.mps_pipe_directory
        if self.mps_active_thread_percentage is not None:
            e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(self.mps_active_thread_percentage)
        return e


def _check_cpus(cpus: Any) -> tuple[int, ...]:
    """``cpus`` as a sorted tuple of cores this process may run on, or a ValueError naming the problem."""
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError(f"cpus={cpus!r} needs os.sched_setaffinity, which this platform lacks (Linux has it); "
                         "leave cpus=None")
    try:
        cores = tuple(sorted({int(c) for c in cpus}))
    except (TypeError, ValueError):
        raise ValueError(f"cpus must be a sequence of core numbers, got {cpus!r}; pass e.g. cpus=(0,)") from None
    allowed = os.sched_getaffinity(0)
    outside = [c for c in cores if c not in allowed]
    if not cores or outside:
        raise ValueError(
            f"cpus must be a non-empty set of the cores this process may use ({sorted(allowed)}), got {cpus!r}"
            + (f" ({outside} are not among them)" if outside else "") + "; pick cores from os.sched_getaffinity(0)"
        )
    return cores
