"""What the parent and a worker say to each other: a worker's spec, the orders it is sent and its replies.

The parent sends :class:`Message` s (a :class:`Command` and its arguments) and gets one :class:`Reply` per message:
a value, or a :class:`Failure` (worker id, exception type, message, traceback), whether the worker is a process or
the calling process.
"""

from __future__ import annotations

import enum
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlstruct.batchers._placement import WorkerPlacement
from rlstruct.errors import ActionRangeError, AgentOutputError, BatcherWorkerError

__all__ = ["CHECK_DEVICE_ENV", "KEPT_ERRORS", "Command", "Failure", "Message", "Reply", "WorkerSpec"]

#: set to a value other than "" or "0", it wraps every worker's agent in RL_Agent_CheckDevice
CHECK_DEVICE_ENV = "RLSTRUCT_CHECK_DEVICE"

#: The errors a worker's failure is raised as, not wrapped: their messages say all (the user's policy or env), and
#: the traceback would only show the batcher.
KEPT_ERRORS: tuple[type[Exception], ...] = (AgentOutputError, ActionRangeError)


@dataclass
class WorkerSpec:
    """Everything a worker needs to build its env and agent (pickled into the child)."""

    worker_id: int
    create_env: Callable[..., Any]
    env_args: dict
    seed: int
    create_agent: Callable[..., Any]
    agent_args: dict
    agent_seed: int | None
    n_timesteps: int
    placement: WorkerPlacement
    check_device: bool
    sync_timings: bool
    cuda_graph: bool = False
    #: the global index of the worker's first env (the batcher has one seed), or ``None`` (one seed per worker)
    env_index: int | None = None


class Command(enum.Enum):
    """What the parent asks a worker to do; the arguments of each ride in :attr:`Message.args`."""

    PROBE = "probe"  # (agent_info, env_info) -> Specs
    BIND = "bind"  # (blocks or None: allocate here and share) -> the block allocated, or None
    RESET = "reset"  # (agent_info, env_info, boundary) -> None
    ACQUIRE = "acquire"  # (agent_info or None, slot, boundary) -> the acquisition's summary
    UPDATE = "update"  # (weights: serialised bytes, or a state dict on the worker's device) -> None
    CARRY = "carry"  # (None) -> the layout of the carried state, or None; (slots) -> None: keep it there
    RESTORE = "restore"  # (agent_info, env_info, boundary) -> None: take the state kept at boundary
    CLOSE = "close"  # () -> no reply expected


@dataclass(frozen=True)
class Message:
    """One order to a worker."""

    command: Command
    args: tuple = ()


@dataclass(frozen=True)
class Failure:
    """What a worker reports when it raised: its id, the exception's type name, message and formatted traceback."""

    worker_id: int
    type_name: str
    message: str
    traceback: str

    @classmethod
    def of(cls, worker_id: int, e: BaseException) -> Failure:
        """The failure of ``e``, being handled now (its traceback is the current one)."""
        return cls(worker_id, type(e).__name__, str(e), traceback.format_exc())

    def error(self, where: str = "", *, with_traceback: bool = True) -> Exception:
        """The :class:`BatcherWorkerError` the parent raises for it; ``where`` follows the worker's id. An
        :class:`AgentOutputError` or :class:`ActionRangeError` stays one (its message says all, the traceback would
        only show the batcher)."""
        k = self.worker_id
        for kept in KEPT_ERRORS:
            if self.type_name == kept.__name__:
                return kept(f"worker {k}{where}: {self.message}")
        message = f": {self.message}" if self.message else ""  # KeyboardInterrupt has none
        shown = f"\n--- traceback in worker {k} ---\n{self.traceback}" if with_traceback else " (traceback above)"
        return BatcherWorkerError(
            f"worker {k}{where} raised {self.type_name}{message}{shown}",
            worker_id=k,
            remote_traceback=self.traceback,
        )


@dataclass(frozen=True)
class Reply:
    """A worker's answer to one message (or its start): a value, or the failure it ended with.

    ``final`` marks the last reply of a worker process, sent once its env and agent are closed: its failure, if
    any, is what closing them raised."""

    value: Any = None
    failure: Failure | None = None
    final: bool = False
