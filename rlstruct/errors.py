"""The exceptions rlstruct raises on bad input or misuse.

Every user-facing error derives from :class:`RLStructError`, and also from the
built-in exception a user would naturally catch (``ValueError`` for bad
values, ``RuntimeError`` for a broken run), so that ``except ValueError``
keeps working in code written before rlstruct.

Messages name the argument, what was expected, what was received, and the fix.
"""

from __future__ import annotations

__all__ = [
    "RLStructError",
    "DeviceMismatchError",
    "DeviceUnavailableError",
    "BatchSizeError",
    "SpaceError",
    "SeedError",
    "EnvStateError",
    "BatcherWorkerError",
    "BatcherStateError",
    "MissingDependencyError",
    "BridgeError",
    "GraphCaptureError",
]


class RLStructError(Exception):
    """Root of every exception raised by rlstruct."""


class DeviceMismatchError(RLStructError, ValueError):
    """A tensor is on another device than the one it must be on."""


class DeviceUnavailableError(RLStructError, ValueError):
    """A device was asked for that this machine does not have."""


class BatchSizeError(RLStructError, ValueError):
    """Tensors that must share their leading (batch or time) sizes do not."""


class SpaceError(RLStructError, ValueError):
    """An action or observation does not fit the environment's space (shape or dtype)."""


class SeedError(RLStructError, ValueError):
    """A seed is not an int in ``[0, 2**31)`` (what every env backend, C ones included, accepts)."""


class EnvStateError(RLStructError, RuntimeError):
    """An env method was called in a state where it cannot run (``step`` before ``reset``, after ``close``, or
    ``step_into`` on an episodic env). Raised by every :class:`~rlstruct.envs.VecEnv` implementation alike."""


class BatcherWorkerError(RLStructError, RuntimeError):
    """A batcher worker failed: it raised, died, or stopped answering.

    Attributes:
        worker_id: index of the failing worker (``-1`` when not known).
        remote_traceback: the traceback formatted in the worker, when it sent one.
    """

    def __init__(self, message: str, worker_id: int = -1, remote_traceback: str | None = None):
        super().__init__(message)
        self.worker_id = worker_id
        self.remote_traceback = remote_traceback

    def __reduce__(self):
        return (type(self), (self.args[0], self.worker_id, self.remote_traceback))


class BatcherStateError(RLStructError, RuntimeError):
    """A batcher method was called in a state where it cannot run (e.g. ``get`` with nothing pending)."""


class MissingDependencyError(RLStructError, ImportError):
    """An optional dependency is needed for this feature; the message names the extra to install."""


class BridgeError(RLStructError, ValueError):
    """An rlstruct env cannot be exposed to gymnasium code as asked (episodic env, seed or options it cannot honour)."""


class GraphCaptureError(RLStructError, RuntimeError):
    """A step could not be captured in a CUDA graph (``cuda_graph=True``): the env or agent synchronizes with the
    host, changes shapes, or keeps its state where a replay cannot see it."""
