"""What a worker process runs: its start, its serving loop, and how it stops.

The child catches everything, replies with the failure, and closes its env and agent in ``finally``: also when it
is told to stop by :data:`STOP_SIGNAL` (the parent's ``close`` giving up on it, or, on Linux, the parent's death),
which it turns into an exception. It ignores SIGINT and SIGTERM: a terminal's Ctrl-C and a scheduler's SIGTERM
reach the whole process group, and the parent, which stops the run cleanly, owns the shutdown.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Any

import torch

from rlstruct._determinism import CUBLAS_WORKSPACE_ENV, apply_from_environment
from rlstruct.allocator import tune_allocator
from rlstruct.batchers._acquire import Acquirer, build_acquirer
from rlstruct.batchers._buffer import allocate_block
from rlstruct.batchers._carry import Carry, carry_layout
from rlstruct.batchers._protocol import Command, Failure, Message, Reply, WorkerSpec
from rlstruct.batchers.weights import load_weights
from rlstruct.seeding import env_seeds

__all__ = ["STOP_SIGNAL", "WorkerTerminated", "serve", "start_worker", "worker_main"]


def _report(spec: WorkerSpec) -> dict[str, Any]:
    keys = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            CUBLAS_WORKSPACE_ENV, *spec.placement.env)
    report = {
        "worker_id": spec.worker_id,
        "pid": os.getpid(),
        "device": str(spec.placement.device),
        "environ": {k: os.environ.get(k) for k in keys},
        "num_threads": torch.get_num_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
    }
    if hasattr(os, "sched_getaffinity"):
        report["cpus"] = sorted(os.sched_getaffinity(0))
    if spec.placement.device.type == "cuda":
        report["cuda_device_count"] = torch.cuda.device_count()
        report["cuda_device_name"] = torch.cuda.get_device_name(spec.placement.device)
    # Read without initialising CUDA: proves a CPU worker never created a context.
    report["cuda_initialized"] = torch.cuda.is_initialized()
    return report


def start_worker(spec: WorkerSpec) -> tuple[Acquirer, dict[str, Any]]:
    """Builds the worker's acquirer; returns it and the ``ready`` reply's value (its env count, its report)."""
    tune_allocator()  # the policy's multi-MiB intermediates come from the heap, whatever the process freed before
    acq = build_acquirer(
        spec.create_env, spec.env_args, spec.seed, spec.create_agent, spec.agent_args, spec.placement.device,
        agent_seed=spec.agent_seed, env_index=spec.env_index, n_timesteps=spec.n_timesteps,
        check_device=spec.check_device, sync_timings=spec.sync_timings, cuda_graph=spec.cuda_graph,
    )
    return acq, {"n_envs": acq.n_envs, "report": _report(spec)}


def serve(acq: Acquirer, msg: Message, *, in_process: bool = False) -> Any:
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
            acq.raise_action_errors()  # done too: read without another sync
        return out
    if cmd is Command.UPDATE:
        (weights,) = args
        acq.agent.update(load_weights(weights, acq.device) if isinstance(weights, bytes) else weights)
        return None
    if cmd is Command.CARRY:
        (slots,) = args
        if slots is None:
            # In process torch's global generator is the caller's too: it is not the worker's to restore.
            return carry_layout(acq, rng=not in_process)
        acq.carry = Carry(slots)
        return None
    if cmd is Command.RESTORE:
        acq.restore(*args)
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


def _die_with_parent(parent_pid: int, forked: bool) -> bool:
    """Asks the kernel for :data:`STOP_SIGNAL` when the parent dies (Linux; quietly nothing elsewhere); ``False``
    when the parent ``parent_pid`` is gone already. A worker ``forked`` from the fork server is that server's child:
    the signal comes when the server exits, which it does when ``parent_pid`` does."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(STOP_SIGNAL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    # The parent may have died before prctl: then no signal will ever come, and this process was re-parented.
    if not forked:
        return os.getppid() == parent_pid
    try:
        os.kill(parent_pid, 0)
    except (ProcessLookupError, PermissionError):  # gone (or its pid now another user's process)
        return False
    return os.getppid() != 1


def _send_quietly(conn, reply: Reply) -> None:
    try:
        conn.send(reply)
    except (OSError, EOFError, BrokenPipeError):  # the parent is gone
        pass


def _leave_the_fork_server() -> None:
    """Closes this worker's copy of the fork server's "alive" pipe: the server exits when every holder of the pipe
    has, and so, without this, when the parent is killed while a worker hangs, neither would ever exit (the worker
    waits for its parent-death signal, which comes when the server exits)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        os.close(fd)
        server._forkserver_alive_fd = None


def worker_main(spec: WorkerSpec, conn, parent_pid: int | None = None, environ: dict[str, str] | None = None) -> None:
    """Entry point of a worker process; ``parent_pid``: die with that parent (``None``: do not); ``environ``: the
    environment of a worker forked from the fork server (``None``: spawned, it started with its own)."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
        _leave_the_fork_server()
    # The parent owns shutdown: a Ctrl-C in a terminal reaches the whole process group, and a worker that
    # died of it mid-acquisition would turn a clean stop into a BatcherWorkerError and a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if STOP_SIGNAL != signal.SIGTERM:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # likewise a scheduler's SIGTERM to the job's processes
    signal.signal(STOP_SIGNAL, _on_stop_signal)
    if hasattr(signal, "pthread_sigmask"):  # held while the parent started this process (_signals_held)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        if parent_pid is not None and not _die_with_parent(parent_pid, forked=environ is not None):
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
        apply_from_environment()  # a deterministic run's worker: before its first kernel, as in the run's process
        seed = spec.agent_seed if spec.agent_seed is not None else spec.seed
        # With one seed for every worker, the global RNG still differs per worker, as with one seed each.
        torch.manual_seed(seed if spec.env_index is None else env_seeds(seed, 1, spec.env_index)[0])
        acq, ready = start_worker(spec)
        conn.send(Reply(ready))
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            if msg.command is Command.CLOSE:
                break
            try:
                conn.send(Reply(serve(acq, msg)))
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
