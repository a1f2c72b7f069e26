"""One Ray cluster for the Ray tests that run in a row in a pytest process: started by the first of them that asks
for it, ended after the last of them (tests/conftest.py's ``ray_head`` fixture and its teardown hook).

A cluster start is seconds of wall time on a 2-core machine (Ray's GCS, raylet and agents, each a process), and
the tests that join a cluster by address prove nothing of its start: RayBatcher's tests, and a run's actors
(``--ray-actors N --ray-address ADDRESS``) from one process or from data-parallel ranks. The cluster is this
process's own: ``ray start --head --block`` on the loopback interface, its own port and temp dir, Ray's token
authentication with a token made for it (a driver joins it only with the token), ended by a SIGTERM to its ``ray
start`` (which stops the node), then a SIGKILL to what is left of its process group. Never ``ray stop``, which ends
every Ray cluster of the host.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from tests.helpers import wall_limit

__all__ = ["IMPORT_ENV", "RayHead", "running", "shared_head", "stop_shared_head"]

#: read by Ray when it is imported: unset, a local cluster listens on every network interface
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
#: the token of every cluster this process starts: a driver process keeps the first token it read
_TOKEN = secrets.token_hex(32)
#: what Ray reads once, when a process imports it: the loopback-only settings and the token of this process's
#: clusters. A test that imports Ray before it joins one (a RayBatcher error without a cluster) sets these first, or
#: the process can join none later ("Authentication token is missing or incorrect").
IMPORT_ENV = {**LOOPBACK_ONLY, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": _TOKEN}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayHead:
    """A one-node Ray cluster, ``ray start --head --block`` in a session of its own, with 2 logical CPUs (what the
    Ray tests' actors ask for together) and a 100 MiB object store.

    Attributes:
        address: ``127.0.0.1:PORT``, what ``ray.init(address=...)`` and ``--ray-address`` take.
        driver_env: the variables a driver joins it with (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN``, ``RAY_ADDRESS``, the
            loopback-only ones); :meth:`joined` sets them in this process.
    """

    def __init__(self) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.driver_env = {**IMPORT_ENV, "RAY_ADDRESS": self.address}
        # short: Ray's sockets live under it, in paths of at most 107 bytes
        self.temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
        self.proc: subprocess.Popen | None = None

    def start(self) -> RayHead:
        """Starts the node and waits for Ray's "started" line (at most ``wall_limit(120)`` seconds).

        Raises:
            RuntimeError: the node did not start in time or exited; the message holds what ``ray start`` printed.
        """
        ray_cli = str(Path(sys.executable).with_name("ray"))
        # Fewer processes that these tests never talk to, each a Python importing Ray (a second of CPU apiece at the
        # start, and polls after): no dashboard, no autoscaler monitor (a fixed cluster), no log monitor (the drivers
        # run with log_to_driver=False). Ray Client's server cannot be left out of a head (its port must be valid).
        cmd = [ray_cli, "start", "--head", "--block", "--port", self.address.split(":")[1], "--num-cpus", "2",
               "--node-ip-address", "127.0.0.1", "--include-dashboard", "false", "--temp-dir", self.temp_dir,
               "--ray-client-server-port", str(free_port()), "--no-monitor", "--include-log-monitor", "false",
               "--dashboard-agent-listen-port", str(free_port()), "--object-store-memory", str(100 * 2**20),
               "--disable-usage-stats"]
        env = {**os.environ, **self.driver_env, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=True)
        limit = wall_limit(120)
        started, printed = _wait_for_line(self.proc, "Ray runtime started", limit)
        if not started:
            self.stop()
            raise RuntimeError(f"ray start did not start a head within {limit:.0f} s:\n{printed[-2000:]}")
        return self

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM to ``ray start``, which stops its node's processes in order (1-2 s), then SIGKILL to what is left of
        its process group once it ended or ``grace`` seconds passed; removes its temp dir. Idempotent. (A SIGTERM to
        the whole group took 30 s: ``ray start`` then waits on a GCS that is ending too.)"""
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the node's own processes, if any outlived its ray start
            proc.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    @contextlib.contextmanager
    def joined(self):
        """This process's environment with :attr:`driver_env` set while the block runs (then restored): a
        ``ray.init()`` in it, or a run's ``--ray-address``, joins this cluster with its token."""
        before = {k: os.environ.get(k) for k in self.driver_env}
        os.environ.update(self.driver_env)
        try:
            yield self
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _wait_for_line(proc: subprocess.Popen, line: str, timeout: float) -> tuple[bool, str]:
    """Reads ``proc``'s output until a line holds ``line``, it ends or ``timeout`` seconds pass: whether the line came,
    and what it printed. A thread reads on (and drops what it reads), so that the node never blocks on a full pipe."""
    seen: list[str] = []
    done = threading.Event()

    def read() -> None:
        for text in proc.stdout:
            if not done.is_set():
                seen.append(text)
                if line in text:
                    done.set()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    done.wait(timeout)
    return any(line in text for text in seen), "".join(seen)


_shared: RayHead | None = None
#: why the last start failed: the next tests that ask fail at once with it, rather than trying again
_failed: RuntimeError | None = None


def shared_head() -> RayHead:
    """The cluster of this process's Ray tests, started on the first call.

    Raises:
        RuntimeError: it did not start (this call's attempt, or the failed one before it, until
            :func:`stop_shared_head`).
    """
    global _shared, _failed
    if _failed is not None:
        raise _failed
    if _shared is None:
        try:
            _shared = RayHead().start()
        except RuntimeError as e:
            _failed = e
            raise
        atexit.register(stop_shared_head)  # an interrupted session ends it too
    return _shared


def running() -> bool:
    """Whether the cluster of :func:`shared_head` runs (or its failed start is remembered)."""
    return _shared is not None or _failed is not None


def stop_shared_head() -> None:
    """Ends the cluster :func:`shared_head` started, if it runs (and forgets a failed start)."""
    global _shared, _failed
    head, _shared, _failed = _shared, None, None
    if head is not None:
        head.stop()
