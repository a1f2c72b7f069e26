"""What a run's folder holds and how each file gets there (:class:`RunFolder`): ``config.json``, the checkpoint,
``summary.json``, the learning curve written whole, ``progress.csv`` grown by appends and swapped whole; the names a
run writes there (:func:`is_run_name`), and what an earlier run left in it (:func:`earlier_run_files`,
:func:`earlier_rows`). Who may write a folder is :mod:`~.folder_claim`'s.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME, save_checkpoint
from rlstruct.algos._train.durable import open_appending, refuse_link, write_whole
from rlstruct.algos._train.figures import learning_curve_png
from rlstruct.algos._train.trackers import TRACKERS_FILE
from rlstruct.errors import ConfigError, RunRecordError

if TYPE_CHECKING:
    from torch import nn

    from rlstruct.algos._env_spec import EnvSpec
    from rlstruct.algos._train.checkpoints import Resume
    from rlstruct.algos._train.config import RunConfig

__all__ = ["CONFIG_NAME", "CSV_NAME", "CURVE_NAME", "LEARNING_CURVE_ENV_VAR", "LOCK_NAME", "SUMMARY_NAME", "RunFolder",
           "check_output", "earlier_rows", "earlier_run_files", "is_run_name", "learning_curve_wanted", "refuse_links"]

log = logging.getLogger(__name__)

#: a run folder's rows, one per training iteration and per evaluation
CSV_NAME = "progress.csv"
#: a run folder's summary, written at its end
SUMMARY_NAME = "summary.json"
#: a run folder's settings, created first: it claims the folder
CONFIG_NAME = "config.json"
#: the file whose exclusive lock the process writing a run's folder holds (:class:`~.folder_claim.RunFolderLock`)
LOCK_NAME = "run.lock"
#: the learning curve's plot, written at a run's end
CURVE_NAME = "learning_curve.png"
#: ``0``: a run draws no learning curve at its end (a sweep's trials, a CI job's runs: matplotlib's first figure in a
#: process costs about a CPU second, each next one 0.2-0.4); ``1`` or unset: it does
LEARNING_CURVE_ENV_VAR = "RLSTRUCT_LEARNING_CURVE"
#: the names a run writes in its folder (besides TensorBoard's ``events.out.tfevents.*``, the disk-backed replay's
#: ``replay-rank*`` of data-parallel ranks and the ``.partial`` files a whole write goes through)
RUN_NAMES = frozenset({CONFIG_NAME, CSV_NAME, SUMMARY_NAME, CHECKPOINT_NAME, CURVE_NAME, TRACKERS_FILE, LOCK_NAME,
                       "videos", "replay"})


def learning_curve_wanted() -> bool:
    """Whether a run draws ``learning_curve.png`` at its end (``RLSTRUCT_LEARNING_CURVE``: ``1`` or unset, yes;
    ``0``, no).

    Raises:
        ConfigError: the variable is set to anything else (the message names it, its value and the choices).
    """
    given = os.environ.get(LEARNING_CURVE_ENV_VAR, "")
    raw = given.strip()
    if raw not in ("", "0", "1"):
        raise ConfigError(f"{LEARNING_CURVE_ENV_VAR} must be 1 (draw learning_curve.png at a run's end) or 0 (do not), "
                          f"got {given!r}; unset it for 1")
    return raw != "0"


def is_run_name(name: str) -> bool:
    """Whether ``name`` is one a run writes in its folder (:data:`RUN_NAMES` and their kin), the only names a start
    that fails gives back (:meth:`~.folder_claim.FolderClaim.release`): another program's files are never the run's
    to remove.

    >>> [is_run_name(n) for n in ("config.json", "progress.csv.partial", "events.out.tfevents.1.h.2.0", "notes.txt")]
    [True, True, True, False]
    """
    name = name.removesuffix(".partial")
    return name in RUN_NAMES or name.startswith(("events.out.tfevents.", "replay-rank"))


def earlier_run_files(path: Path) -> list[str]:
    """The files in ``path`` by which it holds a run already (its config, its log, its checkpoint, its summary or
    TensorBoard events), sorted; none for a missing or empty folder.

    >>> earlier_run_files(Path("no/such/folder"))
    []
    """
    names = (CHECKPOINT_NAME, CONFIG_NAME, CSV_NAME, SUMMARY_NAME)
    found = [name for name in names if (path / name).exists()]
    return sorted(found + [p.name for p in path.glob("events.out.tfevents.*")])


def refuse_links(folder: Path) -> None:
    """Refuses the run folder ``folder`` when a name a run writes there (:func:`is_run_name`), or a name inside a
    folder it writes (``videos``, ``replay``), is a symbolic link: checked before a run writes anything there, so that
    a folder copied from elsewhere never has a run write through its links (each write refuses one too). A missing
    folder passes.

    Raises:
        RunFileLinkError: one is; the message names it and says to remove it.
    """
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return
    for name in names:
        if not is_run_name(name):
            continue
        item = folder / name
        refuse_link(item)
        if item.is_dir():
            for inner in sorted(os.listdir(item)):
                refuse_link(item / inner)


def _holds_run(folder: Path) -> bool:
    """Whether ``folder`` is a run's folder: it holds a run's checkpoint, rows or summary, or the ``config.json`` of
    one (a run killed as it started), not just any ``config.json``."""
    found = earlier_run_files(folder)
    if set(found) - {CONFIG_NAME}:
        return True
    if not found:
        return False
    try:
        return "algo" in json.loads((folder / CONFIG_NAME).read_text() or "{}")
    except (OSError, ValueError, TypeError):
        return False


def check_output(path: str | os.PathLike | None, *, argument: str) -> None:
    """Refuses ``path`` as the file a command writes (``rlstruct export --output``, ``compare --curves``, ``report
    --output``) when it is one of a run's own files (its checkpoint, its rows, its curve, its summary, its lock, its
    TensorBoard events, its replay or videos folder: :func:`is_run_name`), directly or through a symbolic link: a
    command that reads runs never replaces what a run wrote or will write. A new file of another name beside them
    (``runs/x/policy.onnx``) passes. ``argument`` names the option in the message; ``None`` (an option not given)
    passes.

    Raises:
        ConfigError: it is; the message names the run folder and the file, and asks for another path.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = (Path(tmp) / "checkpoint.pt").write_bytes(b"")
    ...     try:
    ...         check_output(Path(tmp) / "checkpoint.pt", argument="--output")
    ...     except ConfigError as e:
    ...         print(str(e).replace(tmp, "RUN"))
    --output must be a path outside every run folder, got 'RUN/checkpoint.pt', which is in the run folder 'RUN' (the \
run's own checkpoint.pt, which it would replace); pass a path outside the run's folder, or a new file name beside its \
files
    """
    if path is None:
        return
    given = Path(path)
    for place in dict.fromkeys((given.absolute(), given.resolve())):
        folder = next((p for p in place.parents if _holds_run(p)), None)
        if folder is None:
            continue
        first = place.relative_to(folder).parts[0]
        if not is_run_name(first):
            continue
        where = "is in" if place == given.absolute() else "leads through a symbolic link into"
        raise ConfigError(f"{argument} must be a path outside every run folder, got {str(path)!r}, which {where} the "
                          f"run folder {str(folder)!r} (the run's own {first}, which it would replace); pass a path "
                          "outside the run's folder, or a new file name beside its files")


class RunFolder:
    """The files of one run's folder, written by the one process that holds its lock
    (:class:`~.folder_claim.RunFolderLock`).

    ``config.json``, the checkpoint, ``summary.json`` and the learning curve are each written whole
    (:func:`~.durable.written_whole`): a kill or a power loss at any moment leaves the previous file or the new one,
    complete. ``progress.csv`` grows by appends (a line a kill cut short is dropped by :func:`earlier_rows`) and is
    flushed to the disk at each checkpoint (:meth:`sync`); it is rewritten only through a whole file swapped in: for
    a new column, or to drop the rows past a resumed checkpoint. With ``tensorboard``, the last row of each write
    also goes to TensorBoard's events. No file is written through a symbolic link
    (:class:`~rlstruct.errors.RunFileLinkError`: :mod:`~.durable`).

    Args:
        path: the folder (created, with its parents).
        rows: the run's rows: the list the run appends each write's rows to before :meth:`write_rows`, all of which
            a rewrite of ``progress.csv`` writes; those it holds at the start (a resumed run's earlier ones) come
            first in the file.
        header: the columns of ``progress.csv`` when the file holds ``rows`` already and nothing else, so that the
            run appends to it (a run resumed in its own folder: :func:`earlier_rows`); ``None``: the file is written
            anew from ``rows``.
        tensorboard: whether to write TensorBoard's events (the ``tensorboard`` extra; a warning without it).
        resumed_env_steps: the env steps of the checkpoint a resumed run continues (``None``: a fresh run): the events
            an earlier session wrote past it are hidden from TensorBoard (``purge_step``), as its rows past it are
            dropped from ``progress.csv``.
    """

    def __init__(self, path: Path, *, rows: list[dict[str, Any]], header: list[str] | None = None,
                 tensorboard: bool = False, resumed_env_steps: int | None = None):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._rows = rows
        #: the columns of progress.csv's header (none before the file has one)
        self._fields: list[str] = []
        self._file: io.TextIOBase | None = None
        self._csv: csv.DictWriter | None = None
        if header is not None:
            self._open_csv(header)
        else:
            self._fields = list(dict.fromkeys(k for r in rows for k in r))
            self._rewrite_csv()
        self._tensorboard = _open_tensorboard(path, resumed_env_steps) if tensorboard else None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` closed the folder's files."""
        return self._file is None or self._file.closed

    def write_config(self, params: dict[str, Any]) -> None:
        """Writes ``config.json``: the run's settings ``params``; one that a resumed run finds empty or damaged (a start
        killed before it was written whole by an earlier release, an edit) is named in a warning as it is replaced."""
        path = self.path / CONFIG_NAME
        damage = _json_damage(path)
        if damage is not None:
            log.warning("%s %s: replaced by the settings of this run (its checkpoint's, for a resumed run)", path,
                        damage)
        write_whole(path, json.dumps(params, indent=2))

    def write_rows(self, rows: list[dict[str, Any]]) -> None:
        """Writes ``rows`` (the run's last ones, numbers) to ``progress.csv``, the last of them to TensorBoard."""
        new = list(dict.fromkeys(k for r in rows for k in r if k not in self._fields))
        if new and self._fields:  # a new column (e.g. the first evaluation's): the file with the wider header
            self._fields = self._fields + new
            self._rewrite_csv()
        elif new:  # the first rows of an empty file
            self._open_csv(new)
            self._csv.writeheader()
            self._csv.writerows(rows)
        else:
            self._csv.writerows(rows)
        self._file.flush()
        if self._tensorboard is not None:
            step = int(rows[-1]["env_steps"])
            for k, v in rows[-1].items():
                if k not in ("iteration", "env_steps") and isinstance(v, (int, float)) and math.isfinite(v):
                    self._tensorboard.add_scalar(k, v, step)

    def sync(self) -> None:
        """Flushes the rows written so far to the disk (``fsync``): at each checkpoint, so that the rows up to it
        outlast a power loss as the checkpoint does."""
        if not self.closed:
            self._file.flush()
            os.fsync(self._file.fileno())

    def write_checkpoint(self, algo: str, config: RunConfig, spec: EnvSpec, model: nn.Module,
                         extra: dict[str, Any]) -> str:
        """Writes ``checkpoint.pt`` (:func:`~.checkpoints.save_checkpoint`); returns its path."""
        return save_checkpoint(self.path / CHECKPOINT_NAME, algo, config, spec, model, extra)

    def write_curve(self, history: list[dict[str, Any]], title: str) -> str | None:
        """Draws the learning curve of ``history`` (:func:`~.figures.learning_curve_png`) into
        ``learning_curve.png``; returns its path, or ``None`` without matplotlib or under
        ``RLSTRUCT_LEARNING_CURVE=0`` (:func:`learning_curve_wanted`)."""
        if not learning_curve_wanted():
            return None
        png = learning_curve_png(history, title)
        if png is None:
            return None
        write_whole(self.path / CURVE_NAME, png)
        return str(self.path / CURVE_NAME)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Writes ``summary.json``: the run's ``summary``."""
        write_whole(self.path / SUMMARY_NAME, json.dumps(summary, indent=2))

    def close(self) -> None:
        """Flushes ``progress.csv`` to the disk and closes it and TensorBoard's events; idempotent."""
        if self.closed:
            return
        self.sync()
        self._file.close()
        if self._tensorboard is not None:
            self._tensorboard.close()

    def _open_csv(self, fields: list[str]) -> None:
        """Opens ``progress.csv`` for appending rows of the columns ``fields`` (its header's)."""
        if self._file is not None:
            self._file.close()
        self._fields = fields
        self._file = open_appending(self.path / CSV_NAME)
        self._csv = csv.DictWriter(self._file, fieldnames=fields, restval="")

    def _rewrite_csv(self) -> None:
        """Replaces ``progress.csv`` whole by the header of ``_fields`` and every row of the run (no header while
        there are no columns), then appends to it."""
        text = io.StringIO(newline="")
        if self._fields:
            writer = csv.DictWriter(text, fieldnames=self._fields, restval="")
            writer.writeheader()
            writer.writerows(self._rows)
        if self._file is not None:
            self._file.close()
        write_whole(self.path / CSV_NAME, text.getvalue())
        self._open_csv(self._fields)


def _json_damage(path: Path) -> str | None:
    """What is wrong with the JSON object file at ``path`` (``"is empty"``, ``"is not JSON ..."``), ``None`` when it
    is one or is missing."""
    try:
        text = path.read_bytes()
    except OSError:
        return None
    if not text.strip():
        return "is empty"
    try:
        record = json.loads(text)
    except ValueError as e:
        return f"is not JSON ({str(e).splitlines()[0]})"
    return None if isinstance(record, dict) else f"is not a JSON object (a {type(record).__name__})"


def _open_tensorboard(path: Path, resumed_env_steps: int | None) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard is an optional extra
        log.warning("tensorboard is not installed (pip install 'rlstruct[tensorboard]'); not writing events")
        return None
    # Events are logged at env_steps: a restart marker past the checkpoint's hides what a killed session logged after
    # it, whose rows the resumed run drops from progress.csv and then logs again.
    purge_step = None if resumed_env_steps is None else resumed_env_steps + 1
    return SummaryWriter(str(path), purge_step=purge_step)


def earlier_rows(resume: Resume) -> tuple[list[dict[str, Any]], list[str] | None]:
    """The rows of ``progress.csv`` in the folder of ``resume``'s checkpoint up to its iteration (a copy of the
    file, or a run killed after its checkpoint, may hold later ones), as numbers; none when the file is gone.

    Returns:
        ``(rows, header)``: ``header``, the file's columns, when it holds those rows and nothing else (no later row,
        no line cut by a kill), so that the resumed run may append to it; else ``None``.

    Raises:
        RunRecordError: the file is not UTF-8 text (the message names the byte's offset and line) or not CSV, has no
            header (its first line is not the columns' names), a cell that is not a number (the message names the line
            and the column), or a training iteration's row twice or out of order (two processes wrote it, or a hand
            edit): a run record the resumed run would continue wrong, left as it is.
    """
    path = resume.folder / CSV_NAME
    if not path.is_file():
        log.warning("%s is missing: progress.csv of the resumed run starts at iteration %d", path, resume.iteration + 1)
        return [], None
    fix = f"correct {path} (or move it away: the resumed run's progress.csv then starts at iteration " \
          f"{resume.iteration + 1}), then resume again"
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise RunRecordError(f"{path} must be UTF-8 text (a run's progress.csv), got byte {data[e.start]:#04x} at "
                             f"offset {e.start} (line {line}), which is not; {fix}") from None
    whole = text.endswith("\n")
    if not whole:  # a line cut by a kill while it was written: the rows before it are whole
        text = text[:text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(text, newline=""))
    if reader.fieldnames is not None and not {"iteration", "env_steps"} <= set(reader.fieldnames):
        first = ",".join(reader.fieldnames)
        raise RunRecordError(f"{path} must start with its header line (iteration,env_steps,...), got "
                             f"{first[:60]!r}; {fix}")
    rows, last = [], None
    for raw in reader:
        row: dict[str, Any] = {}
        for k, v in raw.items():
            if k is None or v in ("", None):
                if k == "iteration":
                    raise RunRecordError(f"{path} line {reader.line_num} column {k!r} must hold a number, got an "
                                         f"empty cell; {fix}")
                continue
            try:
                row[k] = int(float(v)) if k in ("iteration", "env_steps") else float(v)
            except (ValueError, OverflowError):
                raise RunRecordError(f"{path} line {reader.line_num} column {k!r} must hold a number, got {v!r}; "
                                     f"{fix}") from None
        if "eval/return" not in row:  # a training iteration's row: evaluations' rows repeat their iteration
            if last is not None and row["iteration"] <= last[0]:
                raise RunRecordError(f"{path} line {reader.line_num} must hold an iteration after line {last[1]}'s "
                                     f"{last[0]}, got iteration {row['iteration']} (two processes wrote the file, or "
                                     f"it was edited); {fix}")
            last = (row["iteration"], reader.line_num)
        if row.get("iteration", 0) <= resume.iteration:
            rows.append(row)
        else:
            whole = False
    if resume.iteration and not any(r.get("iteration") == resume.iteration for r in rows):
        log.warning("%s holds no row of iteration %d, the checkpoint's: progress.csv of the resumed run lacks rows "
                    "before iteration %d", path, resume.iteration, resume.iteration + 1)
    return rows, list(reader.fieldnames) if whole and reader.fieldnames else None
