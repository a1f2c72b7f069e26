"""The processes and the database around ``rlstruct sweep``'s trials: Optuna imported, the storage URL checked and
opened (heartbeats; a new SQLite study created once by sweeps started together), the trials whose process died
failed, trial N's settings drawn from ``(seed, N)``, and worker processes that end with the sweep.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from rlstruct._processes import owner_gone
from rlstruct._redact import redact_credentials
from rlstruct.errors import ConfigError, MissingDependencyError

__all__ = ["OWNER", "VERDICTS", "check_storage", "creating", "die_with", "fail_dead_trials", "open_storage",
           "preset_needs_a_run", "require_optuna", "trial_seeded_sampler", "wait_for_enqueued_taken"]

#: seconds between a running trial's heartbeats, and without one after which another process fails the trial (a
#: trial process on another machine or in another container that died; in this PID namespace a dead process is seen
#: at once): generous, since a heartbeat waits for the database's lock like any write
_HEARTBEAT_S, _GRACE_S = 20, 300
#: the trial's user attribute naming the process that runs it (:func:`process_identity`)
OWNER = "process"
#: the user attributes of a failed trial whose settings were judged (its run diverged, or refused them); a failed
#: trial without one was interrupted, or its process died
VERDICTS = ("stop_reason", "refused")
#: what the kernel sends a worker process when its sweep process dies: not SIGTERM, which Linux sends once per
#: thread of the dying parent (the worker is handed from one to the next), where a run ends at its second SIGTERM
_PARENT_DIED = getattr(signal, "SIGUSR2", signal.SIGTERM)  # Linux only
#: seconds a worker process whose sweep died has to end its trial's run before SIGALRM ends it
_CLOSE_DEADLINE_S = 120
#: the storage's answer to "what is the fix" for a URL it cannot use
_URL_FIX = "pass an SQLAlchemy URL, e.g. sqlite:///runs/sweeps.db (a file) or postgresql://user@host/db"


def require_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise MissingDependencyError("rlstruct sweep runs on Optuna, which is not installed here; pip install "
                                     "'rlstruct[sweep]'") from None
    return optuna


def trial_seeded_sampler(seed: int) -> Any:
    """Optuna's TPE sampler, drawing trial N's settings from a generator seeded by ``(seed, N)``.

    Trial numbers are unique in a study, so that processes sharing a study (``--n-jobs``, or sweeps started side by
    side) draw different settings, and a second call draws new ones; a sweep run alone is reproducible given its seed.
    """
    optuna = require_optuna()

    class TrialSeededSampler(optuna.samplers.BaseSampler):
        def __init__(self) -> None:
            self._tpe = optuna.samplers.TPESampler(seed=seed)

        def before_trial(self, study: Any, trial: Any) -> None:
            entropy = np.random.SeedSequence([seed, trial.number]).generate_state(1)[0]
            self._tpe = optuna.samplers.TPESampler(seed=int(entropy))
            self._tpe.before_trial(study, trial)

        def infer_relative_search_space(self, study: Any, trial: Any) -> Any:
            return self._tpe.infer_relative_search_space(study, trial)

        def sample_relative(self, study: Any, trial: Any, search_space: Any) -> Any:
            return self._tpe.sample_relative(study, trial, search_space)

        def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
            return self._tpe.sample_independent(study, trial, name, distribution)

        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            self._tpe.after_trial(study, trial, state, values)

        def reseed_rng(self) -> None:
            self._tpe.reseed_rng()

    return TrialSeededSampler()


def wait_for_enqueued_taken(study: Any, timeout: float = 60.0) -> None:
    """Waits until another process (the one that enqueued them) has taken the study's enqueued trials (the preset's):
    on SQLite two processes asking at once can both take the same waiting trial and run it twice, one trial short of
    the sweep."""
    waiting = require_optuna().trial.TrialState.WAITING
    deadline = time.monotonic() + timeout
    while study.get_trials(deepcopy=False, states=(waiting,)) and time.monotonic() < deadline:
        time.sleep(0.1)


def die_with(parent: int) -> None:
    """Ends this worker process when the sweep process ``parent`` dies (a SIGKILL included) as a Ctrl-C would end it:
    a trial's run stops and closes its workers, its folder marked interrupted, and the trial fails; outside a run, a
    SIGTERM raises ``KeyboardInterrupt``. Call it from the worker process's main thread.

    Linux asks the kernel (``PR_SET_PDEATHSIG``: it fires when the thread that started this process ends, which is
    the sweep's calling thread); elsewhere a thread watches the parent's pid.
    """
    signal.signal(signal.SIGTERM, _interrupt)
    if sys.platform.startswith("linux"):
        signal.signal(_PARENT_DIED, _on_parent_died)
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(_PARENT_DIED), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request above
            os.kill(os.getpid(), _PARENT_DIED)
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        _thread.interrupt_main(signal.SIGTERM)  # the handler of SIGTERM runs in the main thread, once

    threading.Thread(target=watch, name="rlstruct-sweep-parent-watch", daemon=True).start()


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _on_parent_died(signum: int, frame: Any) -> None:
    # One SIGTERM, once: a second one would cut the run's closing short.
    signal.signal(_PARENT_DIED, signal.SIG_IGN)
    if hasattr(signal, "alarm"):
        signal.alarm(_CLOSE_DEADLINE_S)  # nobody is left to end this process if closing hangs; SIGALRM's default does
    signal.raise_signal(signal.SIGTERM)


def check_storage(storage: str) -> None:
    """Checks that ``storage`` is an SQLAlchemy URL of a database SQLAlchemy knows, its driver installed (a bare path
    and a misspelt scheme are the usual slips), before anything is created.

    Raises:
        ConfigError: it is not.
        MissingDependencyError: its driver is not installed.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shown = redact_credentials(storage)
    try:
        url = make_url(storage)
    except ArgumentError:
        raise ConfigError(f"storage must be an SQLAlchemy URL, got {shown!r}; {_URL_FIX}") from None
    try:
        url.get_dialect()
    except NoSuchModuleError:
        raise ConfigError(f"storage names the database {url.drivername!r}, which SQLAlchemy does not know, got "
                          f"{shown!r}; {_URL_FIX}") from None
    try:
        url.get_dialect().import_dbapi()
    except ImportError as e:
        raise MissingDependencyError(f"storage {shown!r} needs the database driver {e.name or url.drivername!r}, "
                                     f"which is not installed; install it, or {_URL_FIX}") from None
    if url.get_backend_name() == "sqlite" and (url.host or url.username or url.port):
        raise ConfigError(f"storage must be sqlite:/// then the file's path (three slashes before a relative path, "
                          f"four before an absolute one), got {shown!r}; {_URL_FIX}")


def _sqlite_file(storage: str) -> Path | None:
    """The database file of a SQLite URL (None: another database, or SQLite in memory)."""
    from sqlalchemy.engine import make_url

    url = make_url(storage)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database)


def _make_folder(storage: str, file: Path) -> None:
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"storage {redact_credentials(storage)!r} must be a file in a folder this process can "
                          f"create, got {str(file.parent)!r} ({e.strerror or type(e).__name__}); {_URL_FIX}") from None


def open_storage(storage: str) -> Any:
    """The study's storage, with heartbeats: a trial whose process stops beating for ``_GRACE_S`` is failed. A SQLite
    file gets its folder created (SQLite creates the file, not its folder) and waits up to a minute for a lock another
    trial process holds, rather than SQLite's 5 s, which a loaded machine exceeds.

    Raises:
        ConfigError: the database cannot be opened (one line, the database's own reason).
    """
    from sqlalchemy.exc import SQLAlchemyError

    optuna = require_optuna()
    file = _sqlite_file(storage)
    if file is not None:
        _make_folder(storage, file)
    engine_kwargs = {"connect_args": {"timeout": 60}} if file is not None else {}
    for attempt in range(3):
        try:
            with warnings.catch_warnings():  # Optuna calls its heartbeats experimental
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(storage, engine_kwargs=engine_kwargs,
                                                  heartbeat_interval=_HEARTBEAT_S, grace_period=_GRACE_S)
        except SQLAlchemyError as e:
            # Processes that create the same new database at once race to create its tables (the loser sees them
            # exist, or the version row taken); by the next attempt they are there.
            if attempt == 2:
                reason = redact_credentials(str(getattr(e, "orig", None) or e).splitlines()[0])
                raise ConfigError(f"storage {redact_credentials(storage)!r} cannot be opened ({reason}); check the "
                                  f"URL and that the database is reachable and writable, or {_URL_FIX}") from None
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


@contextlib.contextmanager
def creating(storage: str) -> Iterator[None]:
    """Holds an exclusive lock on a SQLite database's folder, so that sweeps started at once create its tables, the
    study and the preset's trial once (elsewhere: nothing, and the retries of :func:`open_storage`)."""
    file = _sqlite_file(storage)
    try:
        import fcntl
    except ImportError:  # Windows
        fcntl = None
    if file is None or fcntl is None:
        yield
        return
    _make_folder(storage, file)
    fd = os.open(file.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def fail_dead_trials(study: Any) -> list[Any]:
    """Fails the running trials whose process is gone and returns them: those whose
    process provably ended (of this host and this PID namespace: its pid runs no process, or a later one), and those
    without a heartbeat for ``_GRACE_S`` (Optuna's stale trials: another machine's, or another container's on this
    host, whose pids mean nothing here)."""
    optuna = require_optuna()
    running, fail = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.FAIL
    trials_before = study.get_trials(deepcopy=False, states=(running,))
    for trial in trials_before:
        owner = trial.user_attrs.get(OWNER)
        if isinstance(owner, dict) and owner_gone(owner):
            study.tell(trial.number, state=fail, skip_if_finished=True)
    with warnings.catch_warnings():  # Optuna calls its heartbeats experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    after = study.get_trials(deepcopy=False)
    return [after[t.number] for t in trials_before if after[t.number].state == fail]


def preset_needs_a_run(study: Any) -> bool:
    """Whether the study's preset trial must be enqueued again: every trial of it failed without a verdict on its
    settings (:data:`VERDICTS`: its process was killed, or its run interrupted), and none runs or waits."""
    presets = [t for t in study.get_trials(deepcopy=False) if "preset" in t.user_attrs]
    return bool(presets) and all(t.state.name == "FAIL" and not any(k in t.user_attrs for k in VERDICTS)
                                 for t in presets)
