"""Experiment trackers (``--track mlflow,wandb,trackio``): the :class:`Tracker` interface that a run's log
(:class:`~.log.Run`) writes to, one implementation per library, and :func:`open_trackers`, which starts them or,
for a resumed run, continues the tracked runs whose ids the run folder holds (``trackers.json``).

Each library reads its own settings from its own environment variables (``MLFLOW_TRACKING_URI``,
``MLFLOW_EXPERIMENT_NAME``, ``WANDB_MODE``, ``WANDB_PROJECT``, ``WANDB_DIR``, ``TRACKIO_DIR``, ...); the tracked
run's name is the log folder's.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from rlstruct.errors import MissingDependencyError

__all__ = ["TRACKERS", "TRACKERS_FILE", "Tracker", "check_trackers", "open_trackers", "parse_trackers"]

log = logging.getLogger(__name__)

#: the file of a run folder that names the tracked runs it writes to: ``{"mlflow": RUN_ID, ...}``
TRACKERS_FILE = "trackers.json"
#: trackio's project (it has no setting of its own for one)
TRACKIO_PROJECT = "rlstruct"


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
        self._client = mlflow.MlflowClient()
        # Beside a run the caller has open, this one is its child; either way it is written to by its id.
        active = mlflow.start_run(run_id=run_id, run_name=None if run_id else run_name,
                                  nested=mlflow.active_run() is not None)
        self.run_id = active.info.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        # A resumed run keeps the values of its first session: MLflow refuses to change a parameter.
        known = self._client.get_run(self.run_id).data.params
        new = [Param(k, v if isinstance(v, str) else json.dumps(v)) for k, v in params.items() if k not in known]
        for i in range(0, len(new), 100):  # MLflow's limit per batch
            self._client.log_batch(self.run_id, params=new[i:i + 100])

    def log_rows(self, rows: Sequence[Mapping[str, Any]]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, int(r["env_steps"])) for r in rows for k, v in _scalars(r).items()]
        for i in range(0, len(metrics), 1000):
            self._client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        scalars = {f"summary/{k}": v for k, v in _scalars(summary, skip=()).items()}
        self.log_rows([{**scalars, "env_steps": summary["env_steps"]}])
        self._client.log_dict(self.run_id, dict(summary), "summary.json")

    def log_artifact(self, path: Path) -> None:
        self._client.log_artifact(self.run_id, str(path))

    def close(self, *, failed: bool = False) -> None:
        status = "FAILED" if failed else "FINISHED"
        active = self._mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            self._mlflow.end_run(status)
        else:
            self._client.set_terminated(self.run_id, status)


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
    """Checks ``--track`` before the run starts: known names whose library is installed.

    Raises:
        ValueError: an unknown name.
        MissingDependencyError: a tracker's library is not installed (the message names its extra).
    """
    for name in parse_trackers(text):
        if importlib.util.find_spec(TRACKERS[name].module) is None:
            raise MissingDependencyError(f"track={name!r} needs the {TRACKERS[name].module} library, which is not "
                                         f"installed; pip install 'rlstruct[{name}]'")


def open_trackers(text: str | None, logdir: Path, params: Mapping[str, Any], *,
                  resumed_from: Path | None = None) -> list[Tracker]:
    """Starts the trackers of ``--track`` for the run logging into ``logdir`` and records its settings in them.

    Args:
        text: ``--track``'s value.
        logdir: the run folder: its name is the tracked runs' name, and ``trackers.json`` there names them.
        params: the run's settings (``config.json``'s content).
        resumed_from: the folder of the run a resumed run continues: the tracked runs its ``trackers.json`` names
            are continued, the others started.
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
            tracker = cls(logdir.name, ids.get(name), *args)
            trackers.append(tracker)
            ids[name] = tracker.run_id
            tracker.log_params(params)
    except BaseException:  # a library that refuses to start (W&B without a login): end the runs already started
        for tracker in trackers:
            tracker.close(failed=True)
        raise
    (logdir / TRACKERS_FILE).write_text(json.dumps(ids, indent=2))
    return trackers
