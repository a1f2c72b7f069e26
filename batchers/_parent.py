"""The parent's side of worker processes: the handle of one, and the waits and the close over all of them.

Every wait has a timeout and watches the processes, so that a worker that raises, dies or hangs becomes a
:class:`~rlstruct.errors.BatcherWorkerError`, never a deadlock.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from typing import Any, NoReturn

import torch

from rlstruct._main_module import by_value_where_needed, main_file, starting_without_main_file
from rlstruct.batchers._child import STOP_SIGNAL, worker_main
from rlstruct.batchers._protocol import Command, Message, Reply, WorkerSpec
from rlstruct.errors import BatcherWorkerError, BatcherWorkerTimeout, ConfigError

__all__ = ["ProcessWorker", "close_workers", "recv_all", "recv_each"]


def _to_send(spec: WorkerSpec) -> WorkerSpec:
    """``spec`` as it is sent to the child: what a ``__main__`` without a file defines (a notebook cell,
    ``python -``, ``python -c``) wrapped to travel by value, since the child cannot import it; anything else by
    reference. Raises TypeError, naming the argument (and the key of an ``*_args`` dict), when a part the user gave
    cannot be pickled: before any process starts, instead of a pickling traceback from ``start()``."""
    sent: dict[str, Any] = {}
    for name in ("create_env", "create_agent"):
        fn = getattr(spec, name)
        try:
            sent[name] = by_value_where_needed(fn)
            pickle.dumps(sent[name])
        except Exception as e:
            raise TypeError(
                f"{name} must be picklable to reach a worker process (a function defined at module level, "
                f"not a lambda or a local function), got {fn!r}; move it to a module, or use n_processes=0"
            ) from e
    for name in ("env_args", "agent_args"):
        args = getattr(spec, name)
        try:
            sent[name] = {k: by_value_where_needed(v) for k, v in args.items()}
            pickle.dumps(sent[name])
        except Exception as e:
            where = name
            for k, v in args.items():
                try:
                    pickle.dumps(by_value_where_needed(v))
                except Exception:
                    where = f"{name}[{k!r}] = {v!r}"
                    break
            raise TypeError(
                f"{name} must be picklable to reach a worker process, but {where} is not ({type(e).__name__}: {e}); "
                "pass plain values and build resources (locks, files, clients) inside create_env/create_agent, or "
                "use n_processes=0"
            ) from e
    return dataclasses.replace(spec, **sent)


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
def _signals_held(*signals: signal.Signals) -> Iterator[None]:
    # A child started while this thread blocks a signal starts with it blocked (the mask survives fork and exec): a
    # Ctrl-C while it imports torch cannot kill it, and it ignores the signals before it unblocks them (worker_main;
    # the fork server ignores SIGINT and keeps SIGTERM blocked). Here the signal is held, not dropped: it reaches
    # this process's handlers once the start is done (or at once, through another thread), so a Ctrl-C during a
    # start stops the run instead of being lost, as it was under SIG_IGN. Without signal masks (Windows), the
    # signals are ignored instead, from the main thread only.
    if hasattr(signal, "pthread_sigmask"):
        # Started first, outside the block: starting multiprocessing's resource tracker unblocks SIGINT and SIGTERM
        # in this thread when it is done, which inside the block would let the children started after it die of them.
        resource_tracker.ensure_running()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        return
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = [(s, signal.signal(s, signal.SIG_IGN)) for s in signals]
    try:
        yield
    finally:
        for s, handler in handlers:
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


#: What the fork server imports once: a worker forked from it starts with torch and its own code in memory.
_PRELOAD = ["rlstruct.batchers._child"]
_server_started_by: int | None = None  # the pid of the process that started the fork server (a fork of it did not)
#: ``spawn`` starts every worker as a fresh interpreter (the way of rlstruct before its fork server; a program that
#: must not have a fork server, or a comparison); ``forkserver`` or unset: the default below.
START_METHOD_ENV_VAR = "RLSTRUCT_START_METHOD"


def _wanted_method() -> str:
    given = os.environ.get(START_METHOD_ENV_VAR, "")
    raw = given.strip().lower()
    if raw not in ("", "forkserver", "spawn"):
        raise ConfigError(f"{START_METHOD_ENV_VAR} must be 'forkserver' or 'spawn' (how batcher workers start), got "
                          f"{given!r}; unset it for the fork server where the platform has one")
    return raw or "forkserver"


def _cwd_shadows_the_package() -> bool:
    """Whether the current folder holds a folder named ``rlstruct`` that a fresh ``python -c`` would import as a
    namespace package before the installed package (a clone of the repository, run from the folder holding it)."""
    found = importlib.machinery.PathFinder.find_spec("rlstruct", [os.getcwd()])
    return found is not None and found.loader is None


def check_start_method() -> None:
    """Checks ``RLSTRUCT_START_METHOD`` where a program checks its settings, before a worker starts.

    Raises:
        ConfigError: it names no start method (the message names the variable, its value and the choices).
    """
    _wanted_method()


def _start_method(spec: WorkerSpec) -> str:
    """How a worker process starts: ``"forkserver"`` (forked from a server process that imported torch and the
    worker's code once: a start costs milliseconds of CPU instead of the second and a half that importing torch
    again costs a spawned one), or ``"spawn"``: where ``RLSTRUCT_START_METHOD`` asks for it, on a platform without
    a fork server, for a placement with variables of its own (they must be in the environment before the
    interpreter imports anything), and off the main thread until the main thread has started the server (the
    server must ignore the Ctrl-C and the SIGTERM that reach the whole process group: a worker dies with it, and
    the parent owns shutdown). Neither method initialises CUDA in the parent or in the server."""
    if _wanted_method() == "spawn" or "forkserver" not in multiprocessing.get_all_start_methods() or \
            spec.placement.env:
        return "spawn"
    global _server_started_by
    if threading.current_thread() is threading.main_thread():
        from multiprocessing import forkserver

        if sys.version_info < (3, 11) and _cwd_shadows_the_package():
            return "spawn"  # no PYTHONSAFEPATH before 3.11: a spawned worker takes this process's sys.path at once
        # PYTHONSAFEPATH: the server is a ``python -c`` whose sys.path starts with the current folder (multiprocessing
        # does not give it this process's sys.path), where a clone of the repository named rlstruct would be imported
        # as a namespace package in place of the installed one, and every worker forked from it would die.
        with _signals_held(signal.SIGINT, signal.SIGTERM), _patched_environ({"PYTHONSAFEPATH": "1"}):
            # Not the default ``__main__``: the server would run an unguarded script's top level itself and die of
            # it, where a worker that imports the script (as a spawned one does) reports it, naming the guard.
            multiprocessing.set_forkserver_preload(_PRELOAD)
            forkserver.ensure_running()
        _server_started_by = os.getpid()
        return "forkserver"
    return "forkserver" if _server_started_by == os.getpid() else "spawn"


class ProcessWorker:
    """Parent-side handle of one spawned worker process (it ignores SIGINT: the parent owns shutdown)."""

    def __init__(self, spec: WorkerSpec, timeout: float):
        self.worker_id = spec.worker_id
        self.timeout = timeout
        self.device = spec.placement.device
        self._closed = False
        self._buffered: Reply | None = None  # a reply poll() read from a dead worker's pipe
        self._answered = 0  # replies received: a worker that answered once got past its imports and its start
        self._acquisitions = 0  # acquisitions asked of it
        spec = _to_send(spec)
        self.start_method = _start_method(spec)
        ctx = torch.multiprocessing.get_context(self.start_method)
        forked = self.start_method == "forkserver"
        # PR_SET_PDEATHSIG fires when the *thread* that started the child exits: the fork server's one thread, which
        # ends when this process does, or this process's main thread. Spawned from another thread, a worker does not
        # die with its parent.
        main_thread = threading.current_thread() is threading.main_thread()
        parent_pid = os.getpid() if forked or main_thread else None
        # A forked worker takes the environment a spawned one would have started with (the server's is the one it
        # was started in), before it reads any of it.
        environ = {**os.environ, **spec.placement.environment()} if forked else None
        self.conn, child_conn = ctx.Pipe(duplex=True)
        try:
            self.process = ctx.Process(target=worker_main, args=(spec, child_conn, parent_pid, environ),
                                       daemon=True, name=f"rlstruct-worker-{spec.worker_id}")
            with _patched_environ({} if forked else spec.placement.environment()), \
                    _signals_held(signal.SIGINT, signal.SIGTERM), starting_without_main_file():
                self.process.start()
        except BaseException:
            self.conn.close()  # no pipe left open when the start fails
            raise
        finally:
            child_conn.close()

    def send(self, command: Command, *args: Any) -> None:
        self._acquisitions += command is Command.ACQUIRE
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
        elif code and not self._answered:
            how = f"exited with code {code}"
            why = "it failed before it could report, e.g. while importing: its stderr says why"
            if main_file() is not None:  # only a script run as a file is run again by its workers
                why += ("; a worker imports your main script again, so guard the script's code with "
                        "if __name__ == '__main__'")
        elif code:
            how = f"exited with code {code}"
            why = (f"it had started and run {self._acquisitions} acquisition(s): its stderr says why, e.g. an env or "
                   "agent that called sys.exit or os._exit, or a native library that aborted")
        else:
            how, why = f"died (exit code {code})", "it stopped without answering"
        raise BatcherWorkerError(
            f"worker {self.worker_id} (pid {self.process.pid}) {how} without answering ({why}); close the batcher "
            "and build a new one",
            worker_id=self.worker_id,
        )

    def recv(self, timeout: float | None = None, bound: str = "timeout") -> Any:
        """Waits for the next reply's value, at most ``timeout`` seconds (the batcher's argument ``bound``; default
        its ``timeout``), watching the process."""
        if self._buffered is not None:
            reply, self._buffered = self._buffered, None
            self._answered += 1
            if reply.failure is not None:
                raise reply.failure.error()
            return reply.value
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not self.conn.poll(0.02):
            if not self.process.is_alive() and not self.conn.poll(0):
                self._raise_dead()
            if time.monotonic() > deadline:
                raise _timed_out(self.worker_id, timeout, bound)
        try:
            reply = self.conn.recv()
        except (EOFError, OSError):
            self._raise_dead()
        self._answered += 1
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


# What each of the batcher's bounds on a wait covers, for the message of a worker that did not answer within it.
_BOUNDS = {
    "timeout": "an acquisition (or a reset, an update)",
    "start_timeout": "a worker's start (spawning it, importing torch, building its env and agent, the agent's first "
                     "call)",
}


def _timed_out(worker_id: int, timeout: float, bound: str) -> BatcherWorkerTimeout:
    return BatcherWorkerTimeout(
        f"worker {worker_id} did not answer within {timeout:g} s, the batcher's `{bound}`; raise `{bound}` if "
        f"{_BOUNDS[bound]} legitimately takes longer, or look for a hang in the env or agent",
        worker_id=worker_id,
    )


def recv_all(workers: list, timeout: float, bound: str = "timeout") -> list[Any]:
    """Waits for one reply from every worker at once, so that a worker dying is seen while another hangs; at most
    ``timeout`` seconds, the batcher's argument ``bound`` (``"timeout"`` or ``"start_timeout"``), which the error
    names."""
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
            raise _timed_out(workers[pending[0]].worker_id, timeout, bound)
        _wait_until(workers, pending, deadline)
    return results


def recv_each(workers: list, timeout: float, bound: str = "timeout") -> list[Any]:
    """Waits for one reply from every worker, as :func:`recv_all`, but a worker's failure does not end the wait:
    its entry is the :class:`BatcherWorkerError` (it raised, died, or did not answer within ``timeout``, the
    batcher's argument ``bound``), the others' are their values. For a batcher that restarts failed workers."""
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
                results[i] = _timed_out(workers[i].worker_id, timeout, bound)
            break
        _wait_until(workers, pending, deadline)
    return results


def _wait_until(workers: list, pending: list[int], deadline: float) -> None:
    """Sleeps until a pending worker's pipe is readable, at most 50 ms (in-process workers answer ``poll`` without
    one) and never past ``deadline``: a reply later than the bound is a timeout, not one more wait's worth late."""
    from multiprocessing.connection import wait

    conns = [workers[i].conn for i in pending if hasattr(workers[i], "conn")]
    if conns:
        wait(conns, timeout=min(0.05, max(deadline - time.monotonic(), 0.0)))
