"""Workers behind RL_Batcher: a process (spawned) or the calling process, behind one interface.

The parent sends a worker :class:`Message` s (a :class:`Command` and its
arguments) and gets one :class:`Reply` per message: a value, or a
:class:`Failure` (``worker_id``, exception type, message, traceback), the same
shape whether the worker is a process or the calling process. It waits with a
timeout while watching the process, so a worker that raises, dies or hangs
becomes a :class:`BatcherWorkerError`, never a deadlock. The child catches
everything, replies with the failure, and closes its env and agent in
``finally``: also when it is told to stop by :data:`STOP_SIGNAL` (the parent's
``close`` giving up on it, or, on Linux, the parent's death), which it turns
into an exception. It ignores SIGINT and SIGTERM: a terminal's Ctrl-C and a
scheduler's SIGTERM (SLURM) reach the whole process group, and the parent,
which stops the run cleanly, owns the shutdown.
"""

from __future__ import annotations

import ctypes
import enum
import io
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch

from rlstruct.allocator import tune_allocator
from rlstruct.batchers._acquire import Acquirer, build_acquirer
from rlstruct.batchers._buffer import allocate_block
from rlstruct.devices import DeviceLike, as_device
from rlstruct.errors import BatcherWorkerError, BatcherWorkerTimeout

__all__ = [
    "CHECK_DEVICE_ENV",
    "Command",
    "Failure",
    "Message",
    "Reply",
    "LocalWorker",
    "ProcessWorker",
    "WorkerPlacement",
    "WorkerSpec",
    "WorkerTerminated",
    "close_workers",
    "dump_weights",
    "load_weights",
    "recv_all",
    "recv_each",
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


def dump_weights(state_dict: Any) -> bytes:
    """Serialises a CPU state dict once, for every worker."""
    buf = io.BytesIO()
    torch.save(state_dict, buf)
    return buf.getvalue()


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


class Command(enum.Enum):
    """What the parent asks a worker to do; the arguments of each ride in :attr:`Message.args`."""

    PROBE = "probe"  # (agent_info, env_info) -> Specs
    BIND = "bind"  # (blocks or None: allocate here and share) -> the block allocated, or None
    RESET = "reset"  # (agent_info, env_info) -> None
    ACQUIRE = "acquire"  # (agent_info or None, slot) -> the acquisition's summary
    UPDATE = "update"  # (weights: serialised bytes, or a state dict on the worker's device) -> None
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

    def error(self, where: str = "") -> BatcherWorkerError:
        """The :class:`BatcherWorkerError` the parent raises for it; ``where`` follows the worker's id."""
        k = self.worker_id
        message = f": {self.message}" if self.message else ""  # KeyboardInterrupt has none
        return BatcherWorkerError(
            f"worker {k}{where} raised {self.type_name}{message}\n--- traceback in worker {k} ---\n"
            f"{self.traceback}",
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


def _report(spec: WorkerSpec) -> dict[str, Any]:
    keys = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", *spec.placement.env)
    report = {
        "worker_id": spec.worker_id,
        "pid": os.getpid(),
        "device": str(spec.placement.device),
        "environ": {k: os.environ.get(k) for k in keys},
        "num_threads": torch.get_num_threads(),
    }
    if hasattr(os, "sched_getaffinity"):
        report["cpus"] = sorted(os.sched_getaffinity(0))
    if spec.placement.device.type == "cuda":
        report["cuda_device_count"] = torch.cuda.device_count()
        report["cuda_device_name"] = torch.cuda.get_device_name(spec.placement.device)
    # Read without initialising CUDA: proves a CPU worker never created a context.
    report["cuda_initialized"] = torch.cuda.is_initialized()
    return report


def _start(spec: WorkerSpec) -> tuple[Acquirer, dict[str, Any]]:
    """Builds the worker's acquirer; returns it and the ``ready`` reply's value (its env count, its report)."""
    tune_allocator()  # the policy's multi-MiB intermediates come from the heap, whatever the process freed before
    acq = build_acquirer(
        spec.create_env, spec.env_args, spec.seed, spec.create_agent, spec.agent_args, spec.placement.device,
        agent_seed=spec.agent_seed, n_timesteps=spec.n_timesteps, check_device=spec.check_device,
        sync_timings=spec.sync_timings, cuda_graph=spec.cuda_graph,
    )
    return acq, {"n_envs": acq.n_envs, "report": _report(spec)}


def _serve(acq: Acquirer, msg: Message, *, in_process: bool = False) -> Any:
    cmd, args = msg.command, msg.args
    if cmd is Command.PROBE:
        return acq.probe(*args)
    if cmd is Command.BIND:
        (blocks,) = args
        if blocks is None:  # allocated here, on this worker's accelerator, and shared with the parent
            block = allocate_block(acq.specs, acq.n_envs, acq.n_timesteps, acq.device, shared=False)
            acq.bind([block])
            return block
        acq.bind(blocks)
        return None
    if cmd is Command.RESET:
        acq.reset(*args)
        return None
    if cmd is Command.ACQUIRE:
        out = acq.acquire(*args)
        # In process the reader uses the device's stream order (or an event); only another process needs the sync.
        if acq.device.type == "cuda" and not in_process:
            # The parent reads the block through CUDA IPC once it has the reply: writes must be done.
            torch.cuda.synchronize(acq.device)
        return out
    if cmd is Command.UPDATE:
        (weights,) = args
        acq.agent.update(load_weights(weights, acq.device) if isinstance(weights, bytes) else weights)
        return None
    raise ValueError(f"unknown command {cmd!r}")


class WorkerTerminated(SystemExit):
    """Raised in a worker process when it receives :data:`STOP_SIGNAL`, so that its ``finally`` still closes its
    env and agent (a signal's default action would end it at once, leaving simulators, servers and files behind)."""


#: what tells a worker process to stop now: SIGUSR1 (SIGTERM where there is none). Not SIGTERM on POSIX, which a
#: scheduler sends to every process of a job: the workers ignore it and wait for their parent's close.
STOP_SIGNAL = getattr(signal, "SIGUSR1", signal.SIGTERM)
# Seconds a worker told to stop has to close its env and agent before SIGALRM ends it: its parent may be gone,
# with nobody left to kill it if a close hangs.
_TERMINATE_DEADLINE_S = 10
_PR_SET_PDEATHSIG = 1


def _on_stop_signal(signum: int, frame: Any) -> None:
    # Once only: a second signal must not cut the closing that follows short.
    signal.signal(STOP_SIGNAL, signal.SIG_IGN)
    if hasattr(signal, "alarm"):
        signal.alarm(_TERMINATE_DEADLINE_S)  # SIGALRM's default action ends the process
    raise WorkerTerminated(
        f"the worker process received {signal.Signals(signum).name} (the batcher's close() gave up waiting, or its "
        "parent died)"
    )


def _die_with_parent(parent_pid: int) -> bool:
    """Asks the kernel for :data:`STOP_SIGNAL` when the parent dies (Linux; quietly nothing elsewhere); ``False``
    when the parent is gone already."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(STOP_SIGNAL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    # The parent may have died before prctl: then no signal will ever come, and this process was re-parented.
    return os.getppid() == parent_pid


def _send_quietly(conn, reply: Reply) -> None:
    try:
        conn.send(reply)
    except (OSError, EOFError, BrokenPipeError):  # the parent is gone
        pass


def worker_main(spec: WorkerSpec, conn, parent_pid: int | None = None) -> None:
    """Entry point of a spawned worker process; ``parent_pid``: die with that parent (``None``: do not)."""
    # The parent owns shutdown: a Ctrl-C in a terminal reaches the whole process group, and a worker that
    # died of it mid-acquisition would turn a clean stop into a BatcherWorkerError and a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if STOP_SIGNAL != signal.SIGTERM:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # likewise a scheduler's SIGTERM to the job's processes
    signal.signal(STOP_SIGNAL, _on_stop_signal)
    try:
        if parent_pid is not None and not _die_with_parent(parent_pid):
            conn.close()
            return
        _serve_forever(spec, conn)
    except WorkerTerminated:
        pass  # told to stop while closing: what could be closed was (see _serve_forever's finally)


def _serve_forever(spec: WorkerSpec, conn) -> None:
    acq: Acquirer | None = None
    try:
        if spec.placement.cpus is not None:
            os.sched_setaffinity(0, spec.placement.cpus)
        threads = spec.placement.num_threads
        if threads is None:
            threads = 1 if spec.placement.device.type == "cpu" else torch.get_num_threads()
        torch.set_num_threads(threads)
        torch.manual_seed(spec.agent_seed if spec.agent_seed is not None else spec.seed)
        acq, ready = _start(spec)
        conn.send(Reply(ready))
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            if msg.command is Command.CLOSE:
                break
            try:
                conn.send(Reply(_serve(acq, msg)))
            except Exception as e:
                conn.send(Reply(failure=Failure.of(spec.worker_id, e)))
    except BaseException as e:
        # A failure at start, a lost pipe, or an interrupt (the stop signal, SystemExit or KeyboardInterrupt from the
        # env or agent): reported, and the worker stops, since its env and agent may be halfway through a step.
        _send_quietly(conn, Reply(failure=Failure.of(spec.worker_id, e)))
    finally:
        closed = Reply(final=True)
        try:
            if acq is not None:
                acq.close()
        except Exception as e:
            # Sent to the parent, which logs it with the other errors of its close(), as it does in process,
            # instead of an uncaught traceback on this process's stderr.
            closed = Reply(failure=Failure.of(spec.worker_id, e), final=True)
        finally:
            _send_quietly(conn, closed)
            conn.close()


def _check_picklable(spec: WorkerSpec) -> None:
    """Raises TypeError, naming the argument (and the key of an ``*_args`` dict), when a part of ``spec`` the user
    gave cannot be pickled: before any process starts, instead of a pickling traceback from ``start()``."""
    for name in ("create_env", "create_agent"):
        fn = getattr(spec, name)
        try:
            pickle.dumps(fn)
        except Exception as e:
            raise TypeError(
                f"{name} must be picklable to reach a worker process (a function defined at module level, "
                f"not a lambda or a local function), got {fn!r}; move it to a module, or use n_processes=0"
            ) from e
    for name in ("env_args", "agent_args"):
        args = getattr(spec, name)
        try:
            pickle.dumps(args)
        except Exception as e:
            where = name
            for k, v in args.items():
                try:
                    pickle.dumps(v)
                except Exception:
                    where = f"{name}[{k!r}] = {v!r}"
                    break
            raise TypeError(
                f"{name} must be picklable to reach a worker process, but {where} is not ({type(e).__name__}: {e}); "
                "pass plain values and build resources (locks, files, clients) inside create_env/create_agent, or "
                "use n_processes=0"
            ) from e


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


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    # A child started while SIGINT is ignored starts ignoring it (the disposition survives exec, and Python
    # then installs no KeyboardInterrupt handler): a Ctrl-C while it imports torch cannot kill it either.
    # Only the main thread may change handlers; elsewhere the worker's own SIG_IGN covers all but its start.
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


class ProcessWorker:
    """Parent-side handle of one spawned worker process (it ignores SIGINT: the parent owns shutdown)."""

    def __init__(self, spec: WorkerSpec, timeout: float):
        self.worker_id = spec.worker_id
        self.timeout = timeout
        self.device = spec.placement.device
        self._closed = False
        self._buffered: Reply | None = None  # a reply poll() read from a dead worker's pipe
        _check_picklable(spec)
        ctx = torch.multiprocessing.get_context("spawn")
        # PR_SET_PDEATHSIG fires when the *thread* that started the child exits: only a process's main thread lives
        # as long as the process. Started from another thread, a worker does not die with its parent.
        parent_pid = os.getpid() if threading.current_thread() is threading.main_thread() else None
        self.conn, child_conn = ctx.Pipe(duplex=True)
        try:
            self.process = ctx.Process(target=worker_main, args=(spec, child_conn, parent_pid), daemon=True,
                                       name=f"rlstruct-worker-{spec.worker_id}")
            with _patched_environ(spec.placement.environment()), _sigint_ignored():
                self.process.start()
        except BaseException:
            self.conn.close()  # no pipe left open when the start fails
            raise
        finally:
            child_conn.close()

    def send(self, command: Command, *args: Any) -> None:
        try:
            self.conn.send(Message(command, args))
        except (BrokenPipeError, OSError) as e:
            raise BatcherWorkerError(
                f"worker {self.worker_id} is not reachable (exit code {self.process.exitcode}); close the batcher",
                worker_id=self.worker_id,
            ) from e

    def poll(self) -> bool:
        """True when a reply is waiting; raises if the process died without one."""
        if self._buffered is not None:
            return True
        if self.process.is_alive():
            return self.conn.poll(0)
        # A dead worker's pipe polls readable whether a reply is waiting or only the end of the stream: read it.
        # The failure it reported before it stopped says more than its death; a result does not make up for it
        # (nothing more can be asked of it), so its death is reported at once, even while another worker is busy.
        if self.conn.poll(0):
            try:
                self._buffered = self.conn.recv()
            except (EOFError, OSError):
                pass
            if self._buffered is not None and self._buffered.failure is not None:
                return True
            self._buffered = None
        self._raise_dead()

    def _raise_dead(self) -> NoReturn:
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
        """Waits for the next reply's value, at most ``timeout`` seconds, watching the process."""
        if self._buffered is not None:
            reply, self._buffered = self._buffered, None
            if reply.failure is not None:
                raise reply.failure.error()
            return reply.value
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.conn.poll(0.02):
            if not self.process.is_alive() and not self.conn.poll(0):
                self._raise_dead()
            if time.monotonic() > deadline:
                raise BatcherWorkerTimeout(
                    f"worker {self.worker_id} did not answer within {self.timeout:g} s; raise `timeout` if an "
                    "acquisition legitimately takes longer, or look for a hang in the env or agent",
                    worker_id=self.worker_id,
                )
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):
            self._raise_dead()
        if reply.failure is not None:
            raise reply.failure.error()
        return reply.value

    # The steps of close_workers, which runs each over every worker against one deadline.
    def request_close(self) -> None:
        """Sends the close order; it is queued behind the acquisition the worker may be running."""
        if self._closed or not self.process.is_alive():
            return
        try:
            self.conn.send(Message(Command.CLOSE))
        except (BrokenPipeError, OSError):
            pass

    def _drain(self, errors: list[BaseException]) -> bool:
        """Reads the replies waiting (a pending acquisition's, then the final one); ``False`` once the pipe is
        closed."""
        try:
            while self.conn.poll(0):
                reply = self.conn.recv()
                if reply.final and reply.failure is not None:
                    errors.append(reply.failure.error(" (closing its env and agent)"))
        except (EOFError, OSError):
            return False
        return True

    def wait_stopped(self, deadline: float) -> list[BaseException]:
        """Waits until the worker exits or ``deadline`` (``time.monotonic()``); returns what closing raised in it."""
        from multiprocessing.connection import wait

        errors: list[BaseException] = []
        if self._closed:
            return errors
        open_ = True
        while True:
            if open_:
                open_ = self._drain(errors)
            if not self.process.is_alive():
                if open_:
                    self._drain(errors)  # the final reply may have come just before it exited
                return errors
            left = deadline - time.monotonic()
            if left <= 0:
                return errors
            wait([self.conn, self.process.sentinel] if open_ else [self.process.sentinel], timeout=min(left, 0.1))

    def terminate(self) -> bool:
        """Sends :data:`STOP_SIGNAL` (the worker closes its env and agent, then exits) if it still runs; whether it
        did."""
        if self._closed or not self.process.is_alive():
            return False
        try:
            os.kill(self.process.pid, STOP_SIGNAL)
        except ProcessLookupError:  # it exited since
            return False
        return True

    def finish(self, deadline: float) -> None:
        """Joins the worker until ``deadline``, kills it if it still runs, and closes the pipe."""
        if self._closed:
            return
        self._closed = True
        self.process.join(timeout=max(deadline - time.monotonic(), 0.0))
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


def close_workers(workers: list, grace: float, stop_grace: float | None = None) -> list[BaseException]:
    """Stops every worker; returns the errors met (to log: a close must not raise).

    The close order goes to every worker first, and they all get the same ``grace`` seconds to finish what they run
    and close their envs and agents (not ``grace`` each in turn). Those still running are sent :data:`STOP_SIGNAL`,
    which a worker turns into an exception so that it still closes its env and agent, and are killed if they have
    not stopped ``stop_grace`` seconds later (default ``grace``). An in-process worker closes its env and agent when
    its turn comes.
    """
    errors: list[BaseException] = []
    for w in workers:
        w.request_close()
    deadline = time.monotonic() + grace
    for w in workers:
        try:
            errors += w.wait_stopped(deadline)
        except Exception as e:  # keep closing the others
            errors.append(e)
    late = [w for w in workers if w.terminate()]
    for w in late:
        errors.append(BatcherWorkerError(
            f"worker {w.worker_id} had not stopped {grace:g} s after the close order (busy, or hung in its env or "
            f"agent); it was sent {STOP_SIGNAL.name}",
            worker_id=w.worker_id,
        ))
    deadline = time.monotonic() + (grace if stop_grace is None else stop_grace)
    for w in workers:
        w.finish(deadline)
    return errors


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


def recv_each(workers: list, timeout: float) -> list[Any]:
    """Waits for one reply from every worker, as :func:`recv_all`, but a worker's failure does not end the wait:
    its entry is the :class:`BatcherWorkerError` (it raised, died, or did not answer within ``timeout``), the
    others' are their values. For a batcher that restarts failed workers."""
    from multiprocessing.connection import wait

    results: list[Any] = [None] * len(workers)
    pending = list(range(len(workers)))
    deadline = time.monotonic() + timeout
    while pending:
        for i in list(pending):
            try:
                if not workers[i].poll():
                    continue
                results[i] = workers[i].recv()
            except BatcherWorkerError as e:
                results[i] = e
            pending.remove(i)
        if not pending:
            break
        if time.monotonic() > deadline:
            for i in pending:
                results[i] = BatcherWorkerTimeout(
                    f"worker {workers[i].worker_id} did not answer within {timeout:g} s (hung in its env or agent)",
                    worker_id=workers[i].worker_id,
                )
            break
        conns = [workers[i].conn for i in pending if hasattr(workers[i], "conn")]
        if conns:
            wait(conns, timeout=0.05)
    return results


class LocalWorker:
    """The same interface as :class:`ProcessWorker`, run synchronously in the calling process."""

    def __init__(self, spec: WorkerSpec, timeout: float):
        self.worker_id = spec.worker_id
        self.device = spec.placement.device
        self.acq: Acquirer | None = None
        self._reply: Reply | None = None
        self._cause: BaseException | None = None
        try:
            self.acq, ready = _start(spec)
        except Exception as e:
            raise Failure.of(self.worker_id, e).error(" (in process)") from e
        ready["report"] = {"worker_id": spec.worker_id, "pid": os.getpid(), "device": str(self.device),
                           "in_process": True}
        self._reply = Reply(ready)

    def send(self, command: Command, *args: Any) -> None:
        if command is Command.CLOSE:
            return
        assert self.acq is not None
        try:
            self._reply, self._cause = Reply(_serve(self.acq, Message(command, args), in_process=True)), None
        except Exception as e:
            self._reply, self._cause = Reply(failure=Failure.of(self.worker_id, e)), e

    def poll(self) -> bool:
        return self._reply is not None

    def recv(self, timeout: float | None = None) -> Any:
        reply, cause, self._reply, self._cause = self._reply, self._cause, None, None
        assert reply is not None
        if reply.failure is not None:
            raise reply.failure.error(" (in process)") from cause
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
