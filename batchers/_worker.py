"""Workers behind RL_Batcher: a process (spawned) or the calling process, behind one interface.

The parent talks to a worker with tagged messages over a duplex pipe and waits
with a timeout while watching the process, so a worker that raises, dies or
hangs becomes a :class:`BatcherWorkerError`, never a deadlock. The child catches
everything, sends ``("error", type, message, traceback)`` back, and closes its
env and agent in ``finally``.
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from rlstruct.devices import DeviceLike, as_device
from rlstruct.errors import BatcherWorkerError

from rlstruct.batchers._acquire import Acquirer, allocate_block, build_acquirer

__all__ = [
    "CHECK_DEVICE_ENV",
    "LocalWorker",
    "ProcessWorker",
    "WorkerPlacement",
    "WorkerSpec",
    "copy_weights",
    "dump_weights",
    "load_weights",
    "recv_all",
]

CHECK_DEVICE_ENV = "RLSTRUCT_CHECK_DEVICE"


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

    def __post_init__(self) -> None:
        self.device = as_device(self.device)
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


def dump_weights(state_dict: Any) -> bytes:
    """Serialises a CPU state dict once, for every worker."""
    buf = io.BytesIO()
    torch.save(state_dict, buf)
    return buf.getvalue()


def copy_weights(state_dict: Any, device: torch.device) -> Any:
    """A copy of a state dict on ``device``, for an in-process worker (no serialisation; no aliasing of the
    learner's tensors, which it keeps updating in place)."""
    return pytree.tree_map(
        lambda x: x.detach().to(device, copy=True) if isinstance(x, torch.Tensor) else x, state_dict
    )


def load_weights(data: bytes, device: torch.device) -> Any:
    # map_location onto the worker's own device: copying straight to cuda:k can allocate on cuda:0.
    return torch.load(io.BytesIO(data), map_location=device, weights_only=True)


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


def _error_payload(e: BaseException) -> tuple[str, str, str, str]:
    return ("error", type(e).__name__, str(e), traceback.format_exc())


def _report(spec: WorkerSpec) -> dict[str, Any]:
    keys = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", *spec.placement.env)
    report = {
        "worker_id": spec.worker_id,
        "pid": os.getpid(),
        "device": str(spec.placement.device),
        "environ": {k: os.environ.get(k) for k in keys},
        "num_threads": torch.get_num_threads(),
    }
    if spec.placement.device.type == "cuda":
        report["cuda_device_count"] = torch.cuda.device_count()
        report["cuda_device_name"] = torch.cuda.get_device_name(spec.placement.device)
    # Read without initialising CUDA: proves a CPU worker never created a context.
    report["cuda_initialized"] = torch.cuda.is_initialized()
    return report


def _serve(acq: Acquirer, msg: tuple) -> Any:
    cmd = msg[0]
    if cmd == "probe":
        return acq.probe(msg[1], msg[2])
    if cmd == "bind":
        blocks = msg[1]
        if blocks is None:  # allocated here, on this worker's accelerator, and shared with the parent
            block = allocate_block(acq.specs, acq.n_envs, acq.n_timesteps, acq.device, shared=False)
            acq.bind([block])
            return block
        acq.bind(blocks)
        return None
    if cmd == "reset":
        acq.reset(msg[1], msg[2])
        return None
    if cmd == "acquire":
        out = acq.acquire(msg[1], msg[2])
        if acq.device.type == "cuda":
            # The parent reads the block through CUDA IPC once it has the reply: writes must be done.
            torch.cuda.synchronize(acq.device)
        return out
    if cmd == "update":
        weights = msg[1]
        acq.agent.update(load_weights(weights, acq.device) if isinstance(weights, bytes) else weights)
        return None
    raise ValueError(f"unknown order {cmd!r}")


def worker_main(spec: WorkerSpec, conn) -> None:
    """Entry point of a spawned worker process."""
    acq: Acquirer | None = None
    try:
        threads = spec.placement.num_threads
        torch.set_num_threads(threads if threads is not None else 1 if spec.placement.device.type == "cpu" else torch.get_num_threads())
        torch.manual_seed(spec.agent_seed if spec.agent_seed is not None else spec.seed)
        acq = build_acquirer(
            spec.create_env, spec.env_args, spec.seed, spec.create_agent, spec.agent_args, spec.agent_seed,
            spec.n_timesteps, spec.placement.device, spec.check_device, spec.sync_timings, spec.cuda_graph,
        )
        conn.send(("ready", {"n_envs": acq.n_envs, "report": _report(spec)}))
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            if msg[0] == "close":
                break
            try:
                conn.send(("ok", _serve(acq, msg)))
            except BaseException as e:
                conn.send(_error_payload(e))
    except BaseException as e:
        try:
            conn.send(_error_payload(e))
        except (OSError, EOFError):
            pass
    finally:
        try:
            if acq is not None:
                acq.close()
        finally:
            try:
                conn.send(("closed", None))
            except (OSError, EOFError, BrokenPipeError):
                pass
            conn.close()


def _raise_remote(worker_id: int, payload: tuple) -> None:
    _, type_name, message, tb = payload
    raise BatcherWorkerError(
        f"worker {worker_id} raised {type_name}: {message}\n--- traceback in worker {worker_id} ---\n{tb}",
        worker_id=worker_id,
        remote_traceback=tb,
    )


_ENV_LOCK = threading.Lock()


@contextmanager
def _patched_environ(values: dict[str, str]) -> Iterator[None]:
    # A spawned child copies os.environ when it starts: set its variables around start() only.
    with _ENV_LOCK:
        saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


class ProcessWorker:
    """Parent-side handle of one spawned worker process."""

    def __init__(self, spec: WorkerSpec, timeout: float):
        self.worker_id = spec.worker_id
        self.timeout = timeout
        self.device = spec.placement.device
        for name in ("create_env", "create_agent"):
            fn = getattr(spec, name)
            try:
                pickle.dumps(fn)
            except Exception as e:
                raise TypeError(
                    f"{name} must be picklable to reach a worker process (a function defined at module level, "
                    f"not a lambda or a local function), got {fn!r}; move it to a module, or use n_processes=0"
                ) from e
        ctx = torch.multiprocessing.get_context("spawn")
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=worker_main, args=(spec, child_conn), daemon=True,
                                   name=f"rlstruct-worker-{spec.worker_id}")
        with _patched_environ(spec.placement.environment()):
            self.process.start()
        child_conn.close()
        self._closed = False

    def send(self, *msg: Any) -> None:
        try:
            self.conn.send(msg)
        except (BrokenPipeError, OSError) as e:
            raise BatcherWorkerError(
                f"worker {self.worker_id} is not reachable (exit code {self.process.exitcode}); close the batcher",
                worker_id=self.worker_id,
            ) from e

    def poll(self) -> bool:
        """True when a reply is waiting; raises if the process died without one."""
        if self.conn.poll(0):
            return True
        if not self.process.is_alive():
            if self.conn.poll(0):
                return True
            self._raise_dead()
        return False

    def _raise_dead(self) -> None:
        self.process.join(1.0)  # its pipe is closed: the exit code follows at once
        code = self.process.exitcode
        if code is not None and code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
            why = "killed from outside, or by the kernel when memory ran out"
        elif code:
            how = f"exited with code {code}"
            why = ("it failed before it could report, e.g. while importing: its stderr says why; a spawned worker "
                   "imports your main script again, so guard the script's code with if __name__ == '__main__'")
        else:
            how, why = f"died (exit code {code})", "it stopped without answering"
        raise BatcherWorkerError(
            f"worker {self.worker_id} (pid {self.process.pid}) {how} without answering ({why}); close the batcher "
            "and build a new one",
            worker_id=self.worker_id,
        )

    def recv(self, timeout: float | None = None) -> Any:
        """Waits for the next reply (``ready`` or ``ok``), at most ``timeout`` seconds, watching the process."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.conn.poll(0.02):
            if not self.process.is_alive() and not self.conn.poll(0):
                self._raise_dead()
            if time.monotonic() > deadline:
                raise BatcherWorkerError(
                    f"worker {self.worker_id} did not answer within {self.timeout:g} s; raise `timeout` if an "
                    "acquisition legitimately takes longer, or look for a hang in the env or agent",
                    worker_id=self.worker_id,
                )
        try:
            payload = self.conn.recv()
        except (EOFError, OSError):
            self._raise_dead()
        if payload[0] == "error":
            _raise_remote(self.worker_id, payload)
        if payload[0] not in ("ok", "ready"):
            raise BatcherWorkerError(
                f"worker {self.worker_id} answered {payload[0]!r} where a reply was expected",
                worker_id=self.worker_id,
            )
        return payload[1]

    def close(self, grace: float = 5.0) -> None:
        """Asks the worker to close its env and agent, then joins it, killing it if it does not stop."""
        if self._closed:
            return
        self._closed = True
        if self.process.is_alive():
            try:
                self.conn.send(("close",))
                deadline = time.monotonic() + grace
                while self.process.is_alive() and time.monotonic() < deadline:
                    if self.conn.poll(0.02):
                        try:
                            self.conn.recv()
                        except (EOFError, OSError):
                            break
            except (BrokenPipeError, OSError):
                pass
        self.process.join(timeout=0.1)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=grace)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def recv_all(workers: list, timeout: float) -> list[Any]:
    """Waits for one reply from every worker at once, so that a worker dying is seen while another hangs."""
    from multiprocessing.connection import wait

    results: list[Any] = [None] * len(workers)
    pending = list(range(len(workers)))
    deadline = time.monotonic() + timeout
    while pending:
        for i in list(pending):
            if workers[i].poll():
                results[i] = workers[i].recv()
                pending.remove(i)
        if not pending:
            break
        if time.monotonic() > deadline:
            w = workers[pending[0]]
            raise BatcherWorkerError(
                f"worker {w.worker_id} did not answer within {timeout:g} s; raise `timeout` if an "
                "acquisition legitimately takes longer, or look for a hang in the env or agent",
                worker_id=w.worker_id,
            )
        conns = [workers[i].conn for i in pending if hasattr(workers[i], "conn")]
        if conns:
            wait(conns, timeout=0.05)
    return results


class LocalWorker:
    """The same interface as :class:`ProcessWorker`, run synchronously in the calling process."""

    def __init__(self, spec: WorkerSpec, timeout: float):
        self.worker_id = spec.worker_id
        self.device = spec.placement.device
        self._reply: tuple = ()
        try:
            self.acq = build_acquirer(
                spec.create_env, spec.env_args, spec.seed, spec.create_agent, spec.agent_args, spec.agent_seed,
                spec.n_timesteps, spec.placement.device, spec.check_device, spec.sync_timings, spec.cuda_graph,
            )
        except Exception as e:
            self._fail(e)
        report = {"worker_id": spec.worker_id, "pid": os.getpid(), "device": str(self.device), "in_process": True}
        self._reply = ("ready", {"n_envs": self.acq.n_envs, "report": report})

    def _fail(self, e: BaseException) -> None:
        raise BatcherWorkerError(
            f"worker {self.worker_id} (in process) raised {type(e).__name__}: {e}",
            worker_id=self.worker_id,
            remote_traceback=traceback.format_exc(),
        ) from e

    def send(self, *msg: Any) -> None:
        if msg[0] == "close":
            return
        try:
            self._reply = ("ok", _serve(self.acq, msg))
        except Exception as e:
            self._reply = ("error", e, traceback.format_exc())

    def poll(self) -> bool:
        return bool(self._reply)

    def recv(self, timeout: float | None = None) -> Any:
        reply, self._reply = self._reply, ()
        if reply[0] == "error":
            e = reply[1]
            raise BatcherWorkerError(
                f"worker {self.worker_id} (in process) raised {type(e).__name__}: {e}",
                worker_id=self.worker_id,
                remote_traceback=reply[2],
            ) from e
        return reply[1]

    def close(self, grace: float = 5.0) -> None:
        acq, self.acq = getattr(self, "acq", None), None
        if acq is not None:
            acq.close()

