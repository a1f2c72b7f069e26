"""The in-process worker: a worker process's interface, run synchronously in the calling process."""

from __future__ import annotations

import os
from typing import Any

from rlstruct.batchers._acquire import Acquirer
from rlstruct.batchers._child import serve, start_worker
from rlstruct.batchers._protocol import KEPT_ERRORS, Command, Failure, Message, Reply, WorkerSpec

__all__ = ["LocalWorker"]


def _wrapped(worker_id: int, e: BaseException) -> Exception:
    """The :class:`BatcherWorkerError` for ``e``, raised from it: its traceback (the user's frames) shows once."""
    return Failure.of(worker_id, e).error(" (in process)", with_traceback=False)


class LocalWorker:
    """The same interface as :class:`~rlstruct.batchers._parent.ProcessWorker`, run synchronously in the calling
    process. A failure is a :class:`BatcherWorkerError` raised from the exception, whose traceback (the user's
    frames) is shown once; an :class:`AgentOutputError` or :class:`ActionRangeError` is raised as it is (it names
    the agent or the action, and the fix)."""

    def __init__(self, spec: WorkerSpec, timeout: float):
        self.worker_id = spec.worker_id
        self.device = spec.placement.device
        self.acq: Acquirer | None = None
        self._reply: Reply | None = None
        self._cause: BaseException | None = None
        try:
            self.acq, ready = start_worker(spec)
        except Exception as e:
            raise _wrapped(self.worker_id, e) from e
        ready["report"] = {"worker_id": spec.worker_id, "pid": os.getpid(), "device": str(self.device),
                           "in_process": True}
        self._reply = Reply(ready)

    def send(self, command: Command, *args: Any) -> None:
        if command is Command.CLOSE:
            return
        assert self.acq is not None
        try:
            self._reply, self._cause = Reply(serve(self.acq, Message(command, args), in_process=True)), None
        except Exception as e:
            self._reply, self._cause = Reply(failure=Failure.of(self.worker_id, e)), e

    def poll(self) -> bool:
        return self._reply is not None

    def recv(self, timeout: float | None = None, bound: str = "timeout") -> Any:
        reply, cause, self._reply, self._cause = self._reply, self._cause, None, None
        assert reply is not None
        if reply.failure is not None:
            if isinstance(cause, KEPT_ERRORS):
                raise cause
            raise reply.failure.error(" (in process)", with_traceback=False) from cause
        return reply.value

    # close_workers' steps: only wait_stopped has work to do in process.
    def request_close(self) -> None:
        pass

    def wait_stopped(self, deadline: float) -> list[BaseException]:
        acq, self.acq = self.acq, None
        if acq is not None:
            acq.close()
        return []

    def terminate(self) -> bool:
        return False

    def finish(self, deadline: float) -> None:
        pass
