"""Who writes a run's folder: the folder a run asks for (:func:`run_logdir`), claimed by a new run so that it never
replaces another's files (:func:`claim_run_folder`), held by one writer at a time (:class:`RunFolderLock`), given
back by a start that failed before training (:class:`FolderClaim`), known again by its identity
(:func:`folder_moved`: a folder deleted or moved during its run), and a finished run left as it is
(:func:`check_unfinished`). What the folder holds, and how each file is written, is :mod:`~.run_folder`'s.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime
import json
import logging
import os
import shutil
import socket
import tempfile
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rlstruct.algos._train.durable import open_unlinked, sync_file, sync_folder
from rlstruct.algos._train.run_folder import (
    CONFIG_NAME,
    CSV_NAME,
    LOCK_NAME,
    SUMMARY_NAME,
    earlier_run_files,
    is_run_name,
    refuse_links,
)
from rlstruct.errors import ConfigError, RunFinishedError, RunFolderBusyError

if TYPE_CHECKING:
    from rlstruct.algos._env_spec import EnvSpec
    from rlstruct.algos._train.checkpoints import Resume
    from rlstruct.algos._train.config import RunConfig

__all__ = ["FINISHED", "FolderClaim", "RunFolderLock", "check_logdir", "check_unfinished", "claim_logdir",
           "claim_run_folder", "folder_identity", "folder_moved", "given_back_unless_trained", "run_logdir"]

log = logging.getLogger(__name__)

#: the stop reasons of a run that finished, as its settings asked (the others, a signal or another rank's stop, a
#: divergence, leave a run that ``--resume`` continues as it is)
FINISHED = ("target", "budget", "time_limit")


def run_logdir(algo: str, config: RunConfig, resume: Resume | None) -> Path:
    """The log folder a run asks for: ``config.logdir``, else the resumed run's folder, else
    ``runs/<algo>-<env>-<seed>`` (a new run writes there, or to a numbered folder beside it: :func:`claim_logdir`)."""
    default = f"runs/{algo}-{config.env}-{config.seed}" if resume is None else resume.folder
    return Path(config.logdir or default)


def check_logdir(path: Path) -> None:
    """Creates the log folder ``path`` (and its parents) and checks that a file can be written in it, so that a run
    fails before it starts anything rather than at its first log line.

    Raises:
        ConfigError: the folder cannot be created (a missing or read-only parent, a file in the way) or written.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ConfigError(f"logdir must be a folder this process can create and write, got {str(path)!r} ({reason}); "
                          "pass --logdir a writable folder") from None


def claim_logdir(path: Path, *, numbered: bool = True) -> Path:
    """Creates and claims the log folder of a new run: ``path`` when it holds no run (:func:`earlier_run_files`),
    else the first of ``path-2``, ``path-3``, ... that holds none, so that a run never replaces another's files.

    A run's ``config.json`` is created exclusively to claim its folder: runs started at once into the same ``path``
    (a sweep's) each get their own. It is never empty: it appears whole, an empty JSON object until the run writes
    its settings (:func:`_claim_config`), so that a start killed at any moment leaves a readable one.

    Args:
        path: the log folder asked for.
        numbered: whether a used ``path`` gives a numbered folder; False refuses it instead (a ``torchrun`` launch,
            whose ranks and restarts find the run by its ``--logdir``).

    Returns:
        The folder claimed (:func:`claim_run_folder` also says what claiming it created).

    Raises:
        ConfigError: a folder cannot be created or written (:func:`check_logdir`), or ``path`` holds a run and
            ``numbered`` is False.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     first, second = claim_logdir(Path(tmp) / "run"), claim_logdir(Path(tmp) / "run")
    ...     print(first.name, second.name)
    run run-2
    """
    return claim_run_folder(path, numbered=numbered).path


def claim_run_folder(path: Path, *, numbered: bool = True, first_iteration: int = 1) -> FolderClaim:
    """:func:`claim_logdir`, returning what the claim created (:class:`FolderClaim`): a start refused
    before its first training iteration (``first_iteration``: a resumed run's is its checkpoint's next) gives it
    back."""
    base = path.resolve() if path.name in ("", "..") else path  # ".", "..": number the folder's own name
    candidate, n = path, 1
    while True:
        missing = [p for p in (*reversed(candidate.parents), candidate) if not p.exists()]
        check_logdir(candidate)
        found = earlier_run_files(candidate)
        if found and not numbered:
            raise ConfigError(f"logdir={str(path)!r} holds an earlier run ({', '.join(found[:3])}), which a new run "
                              f"would replace; pass a new --logdir, or --resume {path} to continue that run")
        if not found:  # created exclusively: another run may claim the same folder between the check and here
            earlier = frozenset(os.listdir(candidate))
            if _claim_config(candidate):
                break
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    if candidate != path:
        log.warning("%s holds an earlier run (%s): this run writes to %s (--resume %s continues that one)",
                    path, ", ".join(earlier_run_files(path)[:3]), candidate, path)
    return FolderClaim(candidate, missing, earlier, first_iteration, folder_identity(candidate))


def _claim_config(folder: Path) -> bool:
    """Creates ``config.json`` in ``folder`` unless it exists (then False), exclusively and whole: an empty JSON
    object written to a file of its own beside it, flushed, then hard-linked to the name (``link`` fails on an existing
    name, a symbolic link included, and never writes through one). Where the filesystem has no hard links, the file is
    created exclusively and written at once."""
    fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{CONFIG_NAME}.", suffix=".claim")
    try:
        with os.fdopen(fd, "w") as f:
            f.write("{}\n")
        sync_file(temp)
        try:
            os.link(temp, folder / CONFIG_NAME)
        except FileExistsError:
            return False
        except OSError:  # no hard links here (some network and FAT filesystems)
            try:
                fd = open_unlinked(folder / CONFIG_NAME, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write("{}\n")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    sync_folder(folder)
    return True


def folder_identity(path: Path) -> tuple[int, int] | None:
    """The identity of the folder ``path`` (device and inode), by which :func:`folder_moved` knows it again;
    ``None`` when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def folder_moved(path: Path, identity: tuple[int, int] | None) -> bool:
    """Whether the folder at ``path`` is gone or is no longer the one of ``identity`` (:func:`folder_identity`,
    taken when the run claimed or locked it): deleted, or moved away (and maybe another put in its place). Without an
    identity, whether ``path`` is no folder now.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     mine = folder_identity(Path(tmp))
    ...     print(folder_moved(Path(tmp), mine))
    False
    >>> folder_moved(Path(tmp), mine)
    True
    """
    if identity is None:
        return not path.is_dir()
    return folder_identity(path) != identity


@dataclasses.dataclass
class FolderClaim:
    """A log folder claimed by a new run (:func:`claim_run_folder`), and what claiming it created.

    Attributes:
        path: the folder.
        created: the folders the claim created, outermost first (``path`` last, unless it existed).
        earlier: the names in ``path`` before the claim (none when the claim created it).
        first_iteration: the run's first training iteration (1; a resumed run's checkpoint's next).
        identity: the folder's identity when it was claimed (:func:`folder_identity`).
        released: whether :meth:`release` gave the folder back (a failed start's folder is gone by its own doing).
    """

    path: Path
    created: list[Path]
    earlier: frozenset[str]
    first_iteration: int = 1
    identity: tuple[int, int] | None = None
    released: bool = dataclasses.field(default=False, init=False)

    def trained(self) -> bool:
        """Whether ``progress.csv`` holds a row of a training iteration of this run (rows are written out when the
        run closes, also when it raised)."""
        try:
            with open(self.path / CSV_NAME, newline="") as f:
                return any(float(row.get("iteration") or 0) >= self.first_iteration for row in csv.DictReader(f))
        except (OSError, ValueError):
            return False

    def release(self) -> bool:
        """Removes what the claim and the run created, unless the run trained (:meth:`trained`): the names a run
        writes (:func:`~.run_folder.is_run_name`) that the folder did not hold before, then the folders the claim
        created, when nothing else went there since; so that the corrected command gets the same folder. A file or
        folder another program put there meanwhile stays, and so does the folder that holds it. Returns whether it
        did."""
        if self.trained() or not self.path.is_dir():
            return False
        for name in set(os.listdir(self.path)) - self.earlier:
            if not is_run_name(name):
                continue
            item = self.path / name
            if item.is_dir() and not item.is_symlink():
                shutil.rmtree(item, ignore_errors=True)
            else:
                item.unlink(missing_ok=True)
        for folder in reversed(self.created):
            try:
                folder.rmdir()
            except OSError:  # something else is in it: another program's file, a sibling run's folder
                break
        self.released = True
        log.info("%s: the run stopped before its first training iteration; removed what it had written", self.path)
        return True


@contextlib.contextmanager
def given_back_unless_trained(claim: FolderClaim | None) -> Iterator[None]:
    """Runs the body (a run's training); if it raises before the run's first training iteration (a setting that
    only building the run refuses, a tracker or a worker that fails to start, a Ctrl-C), gives back the log folder
    ``claim`` claimed (:meth:`FolderClaim.release`; ``None``: the run claimed none), so that the corrected command
    writes to the same folder."""
    try:
        yield
    except BaseException:
        if claim is not None:
            claim.release()
        raise


class RunFolderLock:
    """The exclusive lock of one run folder, held by the process that writes it for the run's whole life: a second
    process (a requeued ``--resume`` beside a manual one, two array tasks) is refused in one line naming the holder.

    The lock is ``flock`` on :data:`LOCK_NAME` in the folder, which holds the holder's PID, host and start time (for
    the message only: the lock is the kernel's, so a holder killed by any signal, SIGKILL included, releases it as
    it dies). On NFS, Linux emulates ``flock`` with the server's byte-range locks, which hold across clients; a
    filesystem that gives no lock at all (NFS mounted ``nolock``, Lustre without ``flock``) gets a warning and no
    lock. A forked child (the batchers' workers under ``RLSTRUCT_START_METHOD=fork``) closes its copy of the file
    at once: the lock stays the parent's and ends with it; a spawned one never had it.

    Released by :meth:`release` (idempotent; the lock file removed first), and at garbage collection with a
    ``ResourceWarning``. Taking it first refuses a folder where a name a run writes is a symbolic link
    (:func:`~.run_folder.refuse_links`): the lock's holder writes there next.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     lock = RunFolderLock.acquire(Path(tmp))
    ...     try:
    ...         RunFolderLock.acquire(Path(tmp))
    ...     except RunFolderBusyError as e:
    ...         print(str(e).split(":")[0])
    ...     lock.release()
    ...     print(os.listdir(tmp))
    logdir=... must be written by one run at a time, got another run writing it
    []
    """

    #: the locks this process holds (a forked child closes their files: see :func:`_forget_in_child`)
    _held: weakref.WeakSet[RunFolderLock] = weakref.WeakSet()

    def __init__(self, path: Path, fd: int):
        self.path, self._fd, self._pid = path, fd, os.getpid()
        #: the folder's identity when the lock was taken (:func:`folder_moved`)
        self.folder_identity = folder_identity(path.parent)
        RunFolderLock._held.add(self)

    @classmethod
    def acquire(cls, folder: Path) -> RunFolderLock | None:
        """Takes the lock of ``folder`` (an existing, writable folder) without waiting.

        Returns:
            The lock, or ``None`` where the filesystem gives no lock (a warning says so).

        Raises:
            RunFolderBusyError: another process holds it; the message names it.
            RunFileLinkError: a name a run writes in ``folder`` (the lock file among them) is a symbolic link.
            ConfigError: the lock file cannot be created in ``folder``.
        """
        refuse_links(folder)
        try:
            import fcntl
        except ImportError:  # Windows
            log.warning("%s: this platform has no flock: nothing stops a second process from writing this run "
                        "folder at the same time", folder)
            return None
        path = folder / LOCK_NAME
        while True:
            try:
                fd = open_unlinked(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise ConfigError(f"logdir must be a folder this process can write, got {str(folder)!r} ({LOCK_NAME}: "
                                  f"{e.strerror or type(e).__name__}); pass --logdir a writable folder") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunFolderBusyError(f"logdir={str(folder)!r} must be written by one run at a time, got another "
                                         f"run writing it: {_holder(path)}; wait for that run to end (or stop it), "
                                         "then run this command again, or pass a new --logdir") from None
            except OSError as e:
                os.close(fd)
                log.warning("%s: the filesystem gives no lock (%s): nothing stops a second process from writing this "
                            "run folder at the same time", folder, e.strerror or type(e).__name__)
                return None
            # The holder before removes the file as it releases: a lock taken on its old file locks nothing.
            try:
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started})
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        return cls(path, fd)

    @property
    def held(self) -> bool:
        """Whether this process holds the lock still."""
        return self._fd is not None and self._pid == os.getpid()

    def release(self) -> None:
        """Removes the lock file and releases the lock (closes its file); idempotent, and nothing in a forked child
        (the parent holds it)."""
        if not self.held:
            return
        fd, self._fd = self._fd, None
        try:
            if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                self.path.unlink()
        except OSError:  # the folder is gone (a failed start removed it) or read-only now: closing still releases
            pass
        os.close(fd)

    def __del__(self) -> None:
        if self.held:
            with contextlib.suppress(Exception):  # at interpreter exit the warnings machinery may be gone
                warnings.warn(f"the lock of run folder {self.path.parent} was never released; call release() when "
                              "the run ends", ResourceWarning, stacklevel=2)
            self.release()


def _holder(path: Path) -> str:
    """Who holds the lock of ``path``, as its file says."""
    try:
        record = json.loads(path.read_text() or "null")
        return f"PID {record['pid']} on {record['host']}, started {record['started']} ({path})"
    except (OSError, ValueError, TypeError, KeyError):  # the holder is between taking the lock and writing its name
        return f"a process that has not written its name yet ({path})"


def _forget_in_child() -> None:
    """In a forked child: closes the parent's lock files without releasing the locks (``flock`` belongs to the open
    file, which the parent keeps open), so that the child neither releases them nor outlives the parent holding
    them."""
    for lock in list(RunFolderLock._held):
        if lock._fd is not None:
            with contextlib.suppress(OSError):
                os.close(lock._fd)
            lock._fd = None


os.register_at_fork(after_in_child=_forget_in_child)


def stop_reason(resume: Resume) -> str | None:
    """Why the run of ``resume`` stopped: its checkpoint's record, else (a checkpoint written before it was recorded)
    the ``summary.json`` beside it when that summary is of the checkpoint's iteration; ``None``: it did not stop (a
    periodic checkpoint) or nothing says."""
    if resume.stop_reason is not None:
        return resume.stop_reason
    try:
        summary = json.loads((resume.folder / SUMMARY_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("iterations") != resume.iteration:
        return None
    return "signal" if summary.get("interrupted") else summary.get("stop_reason")


def _target(target_return: float | None, stop_at_threshold: bool, spec: EnvSpec) -> float | None:
    return target_return if target_return is not None or not stop_at_threshold else spec.reward_threshold


def check_unfinished(resume: Resume, config: RunConfig, spec: EnvSpec) -> None:
    """Refuses to resume a finished run (:data:`FINISHED`) that ``config`` gives nothing more to do, so that
    ``--resume`` of it changes nothing: neither its rows, nor its checkpoint, nor its summary.

    A finished run continues when ``config`` gives it more to do: env steps left (``max_env_steps`` above the run's,
    or none), and for a run that reached its target a higher target (or none), for one that reached its time limit a
    new ``time_limit`` (it bounds each session's seconds). An interrupted, diverged or killed run resumes as before.

    Raises:
        RunFinishedError: the run finished and ``config`` gives it nothing more to do; the message says what would.
    """
    reason = stop_reason(resume)
    if reason not in FINISHED:
        return
    saved, steps = resume.config, resume.env_steps
    steps_left = config.max_env_steps is None or config.max_env_steps > steps
    more_steps = f"a --max-env-steps above {steps:,}"
    if reason == "budget":
        why = f"its budget of {saved.get('max_env_steps') or steps:,} env steps was spent"
        more, fix = steps_left, more_steps
    elif reason == "target":
        before = _target(saved.get("target_return"), saved.get("stop_at_reward_threshold", True), spec)
        after = _target(config.target_return, config.stop_at_reward_threshold, spec)
        raised = before is None or after is None or after > before
        why = f"an evaluation reached its target return {before:g}" if before is not None else "it reached its target"
        more = raised and steps_left
        fix = "a higher --target-return (or --no-stop-at-reward-threshold)" + ("" if steps_left else
                                                                               f" and {more_steps}")
    else:
        limit = saved.get("time_limit")
        more = steps_left and config.time_limit != limit
        why = f"it reached its time limit of {limit:g} s" if limit is not None else "it reached its time limit"
        fix = "--time-limit SECONDS for this session" + ("" if steps_left else f" and {more_steps}")
    if more:
        log.info("resume=%s finished (%s): continuing it with the new settings", config.resume, reason)
        return
    raise RunFinishedError(f"resume={config.resume!r} is a finished run ({why}, at {steps:,} env steps): nothing to "
                           f"do, the run is left as it is; to train it further, pass {fix}")
