"""Experiment trackers (``--track mlflow,wandb,trackio``): the :class:`Tracker` interface, one implementation per
library, :func:`open_trackers`, which starts them or, for a resumed run, continues the tracked runs whose ids the run
folder holds (``trackers.json``), and a run's trackers together (:class:`Trackers`), which its rows reach as they
are written (:attr:`~.log.Run.written`).

Each library reads its own settings from its own environment variables (``MLFLOW_TRACKING_URI``,
``MLFLOW_EXPERIMENT_NAME``, ``WANDB_MODE``, ``WANDB_PROJECT``, ``WANDB_DIR``, ``TRACKIO_DIR``, ...); the tracked
run's name is the log folder's. Trackers are best effort (:class:`BestEffort`): a tracker that fails, at its start
or later, is one warning and is dropped; training and the run folder's record go on.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import logging
import math
import os
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from rlstruct._redact import redact_credentials
from rlstruct.algos._train.durable import write_whole
from rlstruct.errors import ConfigError, MissingDependencyError

__all__ = ["TRACKERS", "TRACKERS_FILE", "BestEffort", "Tracker", "Trackers", "check_trackers", "open_trackers",
           "parse_trackers"]

log = logging.getLogger(__name__)

#: the file of a run folder that names the tracked runs it writes to: ``{"mlflow": RUN_ID, ...}``
TRACKERS_FILE = "trackers.json"
#: trackio's project (it has no setting of its own for one)
TRACKIO_PROJECT = "rlstruct"
#: MLflow's HTTP settings while a tracker calls it, where the environment does not set them: a server that refuses
#: or does not answer fails a call within seconds (3 tries of at most 5 s, 1 s and 2 s apart) rather than after
#: MLflow's own 7 retries of up to 120 s each, minutes during which no training step runs
MLFLOW_HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                      "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def _scalars(row: Mapping[str, Any], *, skip: tuple[str, ...] = ("env_steps",)) -> dict[str, float]:
    """The finite numbers of a row, but those of ``skip`` (the step counter).

    >>> _scalars({"env_steps": 64, "loss": 0.5, "eval/return": float("nan"), "reached_target": True, "logdir": "x"})
    {'loss': 0.5}
    """
    return {k: float(v) for k, v in row.items()
            if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class Tracker:
    """One tracked run of one library. A tracker receives, in order: the run's settings (:meth:`log_params`), its
    rows as they are written (:meth:`log_rows`), its summary (:meth:`log_summary`) and files
    (:meth:`log_artifact`), then :meth:`close`.

    Attributes:
        name: the ``--track`` name (also the extra that installs the library).
        module: the library's import name.
        run_id: the tracked run's id, stored in the run folder so that a resumed run continues it.
    """

    name: ClassVar[str]
    module: ClassVar[str]
    run_id: str

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Records the run's settings (flat: a nested value is written as JSON)."""
        raise NotImplementedError

    def log_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Records rows of ``progress.csv``, each at its ``env_steps``."""
        raise NotImplementedError

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Records the final summary (``summary.json``'s fields)."""
        raise NotImplementedError

    def log_artifact(self, path: Path) -> None:
        """Attaches a file of the run folder (the checkpoint, the learning curve, a video) to the tracked run."""
        raise NotImplementedError

    def close(self, *, failed: bool = False) -> None:
        """Ends the tracked run, as failed when training raised."""
        raise NotImplementedError


class MLflowTracker(Tracker):
    """An MLflow run in the tracking store and experiment MLflow's environment names (``MLFLOW_TRACKING_URI``,
    ``MLFLOW_EXPERIMENT_NAME``); metrics go in batches, at step ``env_steps``."""

    name, module = "mlflow", "mlflow"

    def __init__(self, run_name: str, run_id: str | None):
        import mlflow

        self._mlflow = mlflow
        _check_sqlite_store(mlflow.get_tracking_uri())
        with _bounded_http():
            self._client = mlflow.MlflowClient()
            # Beside a run the caller has open, this one is its child; either way it is written to by its id.
            active = mlflow.start_run(run_id=run_id, run_name=None if run_id else run_name,
                                      nested=mlflow.active_run() is not None)
        self.run_id = active.info.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        with _bounded_http():
            # A resumed run keeps the values of its first session: MLflow refuses to change a parameter.
            known = self._client.get_run(self.run_id).data.params
            new = [Param(k, v if isinstance(v, str) else json.dumps(v)) for k, v in params.items() if k not in known]
            for i in range(0, len(new), 100):  # MLflow's limit per batch
                self._client.log_batch(self.run_id, params=new[i:i + 100])

    def log_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, int(r["env_steps"])) for r in rows for k, v in _scalars(r).items()]
        with _bounded_http():
            for i in range(0, len(metrics), 1000):
                self._client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        scalars = {f"summary/{k}": v for k, v in _scalars(summary, skip=()).items()}
        self.log_rows([{**scalars, "env_steps": summary["env_steps"]}])
        with _bounded_http():
            self._client.log_dict(self.run_id, dict(summary), "summary.json")

    def log_artifact(self, path: Path) -> None:
        with _bounded_http():
            self._client.log_artifact(self.run_id, str(path))

    def close(self, *, failed: bool = False) -> None:
        status = "FAILED" if failed else "FINISHED"
        active = self._mlflow.active_run()
        with _bounded_http():
            if active is not None and active.info.run_id == self.run_id:
                self._mlflow.end_run(status)
            else:
                self._client.set_terminated(self.run_id, status)

    def drop(self) -> None:
        """Takes this run off MLflow's stack of active runs without calling the store (which just failed), so that
        a later ``mlflow.start_run`` of the process does not nest under it."""
        active = self._mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            with contextlib.suppress(Exception):
                from mlflow.tracking.fluent import _active_run_stack

                _active_run_stack.get().pop()


def _check_sqlite_store(uri: str) -> None:
    """Checks that an SQLite tracking store (``sqlite:///PATH``) is a file this process can write, or create in a
    folder it can write, before MLflow opens it: MLflow retries a store it cannot open ten times over 102 s, during
    which the run does not start.

    Raises:
        ConfigError: it is not (a folder, a file under something that is no folder, a read-only file or folder).
    """
    if not uri.startswith("sqlite:///"):
        return
    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])  # MLflow's own reading of the URL
    if str(path) in ("", ".", ":memory:"):
        return
    why = None
    existing = path
    while not existing.exists() and existing != existing.parent:  # the nearest part of the path that exists
        existing = existing.parent
    if existing == path and not path.is_file():
        why = "it is a folder, not a file" if path.is_dir() else "it is not a regular file"
    elif existing != path and not existing.is_dir():
        why = f"{str(existing)!r} is a file, not a folder"
    try:
        if why is None and existing == path:
            os.close(os.open(path, os.O_RDWR))
        if why is None:  # SQLite writes its journal beside the file; MLflow creates the missing folders
            with tempfile.TemporaryFile(dir=path.parent if existing == path else existing):
                pass
    except OSError as e:
        why = f"{e.strerror or type(e).__name__} (errno {errno.errorcode.get(e.errno, e.errno)})"
    if why is not None:
        raise ConfigError(f"track='mlflow' needs an SQLite store it can write, got MLFLOW_TRACKING_URI="
                          f"{redact_credentials(uri)!r}: {why}; set MLFLOW_TRACKING_URI to a file in a writable "
                          "folder, e.g. sqlite:///mlflow.db")


@contextlib.contextmanager
def _bounded_http() -> Iterator[None]:
    """MLflow's HTTP settings bounded (:data:`MLFLOW_HTTP_BOUNDS`, where the environment sets none) for the calls
    inside, and urllib3's line per retry kept quiet: a failure is the one warning of :class:`BestEffort`. MLflow
    reads these variables at each request, so they hold for these calls only."""
    added = {k: v for k, v in MLFLOW_HTTP_BOUNDS.items() if k not in os.environ}
    os.environ.update(added)
    pool_log = logging.getLogger("urllib3.connectionpool")
    level = pool_log.level
    pool_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        pool_log.setLevel(level)
        for k in added:
            os.environ.pop(k, None)


class WandbTracker(Tracker):
    """A W&B run configured by W&B's environment (``WANDB_MODE``, ``WANDB_PROJECT``, ``WANDB_ENTITY``,
    ``WANDB_DIR``); rows are logged at step ``env_steps``, files saved into the run."""

    name, module = "wandb", "wandb"

    def __init__(self, run_name: str, run_id: str | None, logdir: Path):
        import wandb

        self._logdir = logdir
        self._run = wandb.init(name=run_name, id=run_id, resume="allow" if run_id else None, reinit="create_new")
        self.run_id = self._run.id

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._run.config.update(dict(params), allow_val_change=True)

    def log_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        for r in rows:
            self._run.log(_scalars(r), step=int(r["env_steps"]))

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        self._run.summary.update({f"summary/{k}": v for k, v in summary.items()})

    def log_artifact(self, path: Path) -> None:
        self._run.save(str(path), base_path=str(self._logdir), policy="now")

    def close(self, *, failed: bool = False) -> None:
        self._run.finish(exit_code=1 if failed else 0)


class TrackioTracker(Tracker):
    """A trackio run of the project ``rlstruct``, where trackio's environment puts it (``TRACKIO_DIR``, or a Space
    by ``TRACKIO_SPACE_ID``); trackio names runs, so the run's name is its id."""

    name, module = "trackio", "trackio"

    def __init__(self, run_name: str, run_id: str | None):
        import trackio

        self._trackio = trackio
        self._run = trackio.init(project=TRACKIO_PROJECT, name=run_id or run_name,
                                 resume="must" if run_id else "never", embed=False)
        self.run_id = self._run.name

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._run.config.update(dict(params))

    def log_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        for r in rows:
            self._run.log(_scalars(r), step=int(r["env_steps"]))

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        self._run.log({f"summary/{k}": v for k, v in _scalars(summary, skip=()).items()},
                      step=int(summary["env_steps"]))

    def log_artifact(self, path: Path) -> None:
        self._trackio.log_artifact(str(path))

    def close(self, *, failed: bool = False) -> None:
        self._run.finish()


class BestEffort(Tracker):
    """A tracker whose failures do not reach the run: the first exception one of its calls raises is one warning
    (the tracker, the call, the error), and the tracker is dropped: every later call does nothing. Training, and
    the run folder's own record (``progress.csv``, ``summary.json``, the checkpoint), go on without it.

    Args:
        tracker: the tracker to call.

    >>> class Failing(Tracker):
    ...     name, module, run_id = "mlflow", "mlflow", "r1"
    ...     def log_rows(self, rows):
    ...         raise ConnectionError("the server went away")
    >>> tracker = BestEffort(Failing())
    >>> tracker.log_rows([{"env_steps": 64, "loss": 0.5}])
    >>> tracker.dropped, tracker.log_rows([{"env_steps": 128}])
    (True, None)
    """

    def __init__(self, tracker: Tracker):
        self.tracker = tracker
        self.name, self.module, self.run_id = tracker.name, tracker.module, tracker.run_id
        #: whether a call failed (every later one does nothing)
        self.dropped = False

    def _call(self, what: str, *args: Any, **kwargs: Any) -> None:
        if self.dropped:
            return
        try:
            getattr(self.tracker, what)(*args, **kwargs)
        except Exception as e:  # any library error, network or store: the run must not depend on the tracker
            self.dropped = True
            log.warning("%s; the run goes on without it", _failure(self.name, what, e))
            drop = getattr(self.tracker, "drop", None)
            if drop is not None:
                drop()

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._call("log_params", params)

    def log_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        self._call("log_rows", rows)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        self._call("log_summary", summary)

    def log_artifact(self, path: Path) -> None:
        self._call("log_artifact", path)

    def close(self, *, failed: bool = False) -> None:
        self._call("close", failed=failed)


def _failure(name: str, what: str, error: BaseException) -> str:
    """One line: which tracker failed, in which call, with what; without the credentials of the URLs it names (a
    library's error quotes the server's URL as configured, password and token included).

    >>> _failure("mlflow", "log_rows", ConnectionError("refused\\nmore"))
    'track=mlflow failed in log_rows (ConnectionError: refused) and is dropped'
    >>> _failure("mlflow", "its start", ConnectionError("API request to https://u:pw@host/api failed"))
    'track=mlflow failed in its start (ConnectionError: API request to https://***@host/api failed) and is dropped'
    """
    message = redact_credentials((str(error).strip().splitlines() or [""])[0])
    if len(message) > 600:  # a library's dump of a request or a response
        message = message[:600] + "..."
    return f"track={name} failed in {what} ({type(error).__name__}: {message}) and is dropped"


#: ``--track``'s names -> their tracker
TRACKERS: dict[str, type[Tracker]] = {t.name: t for t in (MLflowTracker, WandbTracker, TrackioTracker)}


def parse_trackers(text: str | None) -> tuple[str, ...]:
    """The tracker names of ``--track`` (comma-separated; ``None`` or ``""``: none).

    Raises:
        ValueError: a name that is not a tracker.

    >>> parse_trackers("mlflow, wandb")
    ('mlflow', 'wandb')
    >>> parse_trackers("neptune")
    Traceback (most recent call last):
    ...
    ValueError: track must name trackers among mlflow, wandb, trackio (comma-separated), got 'neptune'
    """
    names = tuple(dict.fromkeys(n.strip() for n in (text or "").split(",") if n.strip()))
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(f"track must name trackers among {', '.join(TRACKERS)} (comma-separated), got "
                         f"{','.join(unknown)!r}")
    return names


def check_trackers(text: str | None) -> None:
    """Checks ``--track`` before the run starts: known names whose library is installed, and an MLflow store that
    MLflow will open.

    Raises:
        ValueError: an unknown name.
        MissingDependencyError: a tracker's library is not installed (the message names its extra).
        ConfigError: MLflow's tracking URI is a local file store, which MLflow 3 refuses without
            ``MLFLOW_ALLOW_FILE_STORE=true``.
    """
    for name in parse_trackers(text):
        if importlib.util.find_spec(TRACKERS[name].module) is None:
            raise MissingDependencyError(f"track={name!r} needs the {TRACKERS[name].module} library, which is not "
                                         f"installed; pip install 'rlstruct[{name}]'")
        if name == "mlflow":
            _check_mlflow_store()


def _check_mlflow_store() -> None:
    """Refuses MLflow's local file store where the installed MLflow refuses it (it answers with a long traceback
    once the run has started)."""
    from mlflow import environment_variables, get_tracking_uri

    allow = getattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE", None)
    if allow is None or allow.get():  # an MLflow without the opt-in, or the opt-in given
        return
    uri = get_tracking_uri()
    if urllib.parse.urlparse(uri).scheme in ("", "file"):
        raise ConfigError(f"track='mlflow' needs a database store, got MLFLOW_TRACKING_URI="
                          f"{redact_credentials(uri)!r}, a file store "
                          "that MLflow 3 no longer opens; set MLFLOW_TRACKING_URI=sqlite:///mlflow.db (or "
                          "MLFLOW_ALLOW_FILE_STORE=true to keep the file store)")


def open_trackers(text: str | None, logdir: Path, params: Mapping[str, Any], *,
                  resumed_from: Path | None = None) -> list[Tracker]:
    """Starts the trackers of ``--track`` for the run logging into ``logdir`` and records its settings in them.

    Every tracker is best effort (:class:`BestEffort`): one that fails to start is one warning and is left out, the
    others and the run go on.

    Args:
        text: ``--track``'s value.
        logdir: the run folder: its name is the tracked runs' name, and ``trackers.json`` there names them.
        params: the run's settings (``config.json``'s content).
        resumed_from: the folder of the run a resumed run continues: the tracked runs its ``trackers.json`` names
            are continued, the others started.

    Returns:
        the trackers that started, each a :class:`BestEffort`.
    """
    names = parse_trackers(text)
    if not names:
        return []
    ids: dict[str, str] = {}
    if resumed_from is not None and (resumed_from / TRACKERS_FILE).is_file():
        ids = json.loads((resumed_from / TRACKERS_FILE).read_text())
    trackers: list[Tracker] = []
    try:
        for name in names:
            cls = TRACKERS[name]
            args = (logdir,) if cls is WandbTracker else ()
            try:
                tracker = BestEffort(cls(logdir.name, ids.get(name), *args))
            except Exception as e:  # an unreachable server, a refused login: the run goes on untracked there
                log.warning("%s; the run goes on without it", _failure(name, "its start", e))
                continue
            tracker.log_params(params)
            if not tracker.dropped:
                trackers.append(tracker)
                ids[name] = tracker.run_id
    except BaseException:  # an interrupt while starting: end the tracked runs already started
        for tracker in trackers:
            tracker.close(failed=True)
        raise
    if trackers:
        write_whole(logdir / TRACKERS_FILE, json.dumps(ids, indent=2))
    return trackers


class Trackers:
    """The trackers of one run (:func:`open_trackers`), each sent the run's rows as they are written
    (:meth:`log_rows`), then its summary and files (:meth:`report`), then ended (:meth:`close`).

    Args:
        trackers: the trackers (none: a run without ``--track``, or a rank that does not log).
    """

    def __init__(self, trackers: Sequence[Tracker] = ()):
        self._trackers = list(trackers)

    def log_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Sends ``rows`` of ``progress.csv`` to every tracker."""
        for tracker in self._trackers:
            tracker.log_rows(rows)

    def report(self, summary: Mapping[str, Any], files: Sequence[str | Path | None]) -> None:
        """Sends the run's final ``summary`` and ``files`` (the checkpoint, the curve, the videos; ``None``: not
        written) to every tracker, then ends their tracked runs."""
        for tracker in self._trackers:
            tracker.log_summary(summary)
            for path in files:
                if path is not None:
                    tracker.log_artifact(Path(path))
        self.close()

    def close(self, *, failed: bool = False) -> None:
        """Ends the tracked runs (as failed: training raised); idempotent."""
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close(failed=failed)
