"""The record of one training run: its clock and budget (:class:`Run`), its logs (``progress.csv``, TensorBoard,
the progress bar, periodic checkpoints) and what ``train`` returns (:class:`TrainResult`).

A run given a :class:`~.checkpoints.Resume` (``--resume``) continues the counters, the log folder and
``progress.csv`` of the run that wrote it, with seeds of its own (:func:`session_seed`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME, Resume, save_checkpoint
from rlstruct.algos._train.compile_cache import CompileMeter
from rlstruct.algos._train.config import RunConfig
from rlstruct.algos._train.finite import DivergenceGuard
from rlstruct.algos._train.result import reaches, run_target
from rlstruct.algos._train.run_folder import CONFIG_NAME, CSV_NAME, SUMMARY_NAME, FolderClaim, write_whole
from rlstruct.algos._train.seeds import session_seed
from rlstruct.algos._train.trackers import Tracker, open_trackers
from rlstruct.errors import ConfigError, RunRecordError

if TYPE_CHECKING:
    from rlstruct.algos._train.evaluation import Evaluator

__all__ = ["Run", "check_logdir", "claim_logdir", "claim_run_folder", "earlier_run_files", "run_logdir"]

log = logging.getLogger(__name__)

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


def earlier_run_files(path: Path) -> list[str]:
    """The files in ``path`` by which it holds a run already (its config, its log, its checkpoint, its summary or
    TensorBoard events), sorted; none for a missing or empty folder.

    >>> earlier_run_files(Path("no/such/folder"))
    []
    """
    names = (CHECKPOINT_NAME, Run.CONFIG_NAME, Run.CSV_NAME, Run.SUMMARY_NAME)
    found = [name for name in names if (path / name).exists()]
    return sorted(found + [p.name for p in path.glob("events.out.tfevents.*")])


def claim_logdir(path: Path, *, numbered: bool = True) -> Path:
    """Creates and claims the log folder of a new run: ``path`` when it holds no run (:func:`earlier_run_files`),
    else the first of ``path-2``, ``path-3``, ... that holds none, so that a run never replaces another's files.

    A run's ``config.json`` is created exclusively to claim its folder: runs started at once into the same ``path``
    (a sweep's) each get their own.

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
    """:func:`claim_logdir`, returning what the claim created (:class:`~.run_folder.FolderClaim`): a start refused
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
        try:
            if not found:  # created exclusively: another run may claim the same folder between the check and here
                earlier = frozenset(os.listdir(candidate))
                os.close(os.open(candidate / Run.CONFIG_NAME, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                break
        except FileExistsError:
            pass
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    if candidate != path:
        log.warning("%s holds an earlier run (%s): this run writes to %s (--resume %s continues that one)",
                    path, ", ".join(earlier_run_files(path)[:3]), candidate, path)
    return FolderClaim(candidate, missing, earlier, first_iteration)


class Run:
    """The clock, the budget, and the logs of one training run.

    Rows are recorded once per iteration with statistics that may still be tensors on the learner device;
    every ``log_every`` iterations (and at each evaluation) they are converted together, with one host
    sync, and written to ``progress.csv`` (every row), TensorBoard (the last row of the window and every
    evaluation) and the progress bar. ``progress.csv`` grows by appends; it is rewritten only through a whole file
    swapped in (:func:`~.run_folder.write_whole`): for a new column, or to drop the rows past a resumed checkpoint.

    Args:
        algo: the algorithm's name.
        config: the run's config.
        spec: the env's description (for its reward threshold).
        start: ``time.perf_counter()`` when the run was launched (default: now): ``rlstruct train``'s process start,
            or the call of ``train``.
        resume: the checkpoint the run continues (``None``: a fresh run). Its ``iteration``, ``env_steps`` and wall
            time are the counters' starting values; the log folder defaults to the checkpoint's; the rows of
            ``progress.csv`` of the checkpoint's folder up to its iteration come first in :attr:`history` and in
            the new ``progress.csv``.
        logger: whether this process writes the run's files (``progress.csv``, TensorBoard, the bar,
            ``config.json``): rank 0 of a data-parallel run does, the other ranks only count.
        world_size: the data-parallel ranks of the run (1: one process).
        source: where the algorithm came from (``"a2c"``, ``"mylab.myalgo:ALGORITHM"``; default: ``algo``): what
            ``config.json`` and the checkpoints record as ``"algorithm"``, for the commands that rebuild the run.

    Attributes:
        seed: the seed of this session's envs, agents and generators (:func:`session_seed`).
        startup_s: seconds from ``start`` to the end of this session's first training iteration (None before).
        time_to_target_s: seconds from ``start`` to the end of the evaluation that reached the target (None before).
    """

    CSV_NAME = CSV_NAME
    SUMMARY_NAME = SUMMARY_NAME
    CONFIG_NAME = CONFIG_NAME

    def __init__(self, algo: str, config: RunConfig, spec: EnvSpec, *, start: float | None = None,
                 resume: Resume | None = None, logger: bool = True, world_size: int = 1, source: str | None = None):
        self.algo = algo
        self.source = source or algo
        #: whether this process writes the run's files (rank 0 of a data-parallel run; a plain run always)
        self.logger = logger
        #: the data-parallel ranks of the run (recorded in its checkpoints)
        self.world_size = world_size
        self.config = config
        self.spec = spec
        self.target_return = run_target(config, spec)
        self.start = time.perf_counter() if start is None else start
        self.logdir = run_logdir(algo, config, resume)
        if logger:
            self.logdir.mkdir(parents=True, exist_ok=True)
        self.env_steps = 0 if resume is None else resume.env_steps
        self.iteration = 0 if resume is None else resume.iteration
        self.seed = session_seed(config.seed, self.iteration)
        #: the wall time of the earlier sessions of a resumed run: rows count ``wall_time_s`` over all of them
        self.wall_offset = 0.0 if resume is None else resume.wall_time_s
        earlier, header = ([], None) if resume is None else _earlier_rows(resume)
        self.history: list[dict[str, float]] = earlier
        #: more columns of every training row: name -> what gives its value at the row's end
        self.columns: dict[str, Callable[[], float]] = {}
        #: called after each evaluation is recorded, with ``(weights, env_steps)`` (``weights()``: the CPU state
        #: dict the loop holds): e.g. the videos of ``--video-every``
        self.evaluation_hooks: list[Callable[[Callable[[], dict], int], None]] = []
        #: called with each evaluation's row (``"eval/return"``, ``"eval/launch_env_steps"``, ...) as it arrives during
        #: training (not the final one): a sweep's pruning; an exception it raises ends the run
        self.evaluation_callbacks: list[Callable[[dict[str, float]], None]] = []
        #: the run's videos (``--video-every``), set by :func:`~.session.open_batchers`; None without
        self.videos: Any = None
        self.last_eval: float | None = None
        #: the env steps at which the weights of :attr:`last_eval` were taken for their evaluation
        self.last_eval_env_steps: int | None = None
        #: whether a confirmation cleared the target (the run then stops, keeping :attr:`kept_weights`)
        self.reached_target = False
        #: the weights whose confirmation cleared the target, and the env steps at which they were taken
        self.kept_weights: dict[str, torch.Tensor] | None = None
        self.kept_env_steps: int | None = None
        self.startup_s: float | None = None
        #: what torch.compile did in this process during the run (seconds, cache hits): the summary's ``compile``
        self.compile_meter = CompileMeter()
        self.time_to_target_s: float | None = None
        #: the signal (``"SIGINT"``: a Ctrl-C, or ``"SIGTERM"``) that interrupted the run during
        #: :func:`training_run`, else ``None``: the loop stops at its next check
        self.stop_signal: str | None = None
        #: the batcher worker's failure that stopped the run (``{"worker_id", "error", "traceback"}``: the error's first
        #: line, the worker's traceback or ``None``): a worker process that raised, died or hung with no restart left;
        #: the learner here is intact
        self.worker_failure: dict[str, Any] | None = None
        #: why :meth:`should_stop` last said to stop (one of :data:`~.result.STOP_REASONS`), else ``None``
        self.stop_reason: str | None = None
        #: finds a non-finite loss, gradient norm or weight in what :meth:`flush` converts (see :attr:`diverged`)
        self.guard = DivergenceGuard()
        self._pending: list[dict[str, Any]] = []
        #: the columns of progress.csv's header (none before the file has one)
        self._csv_fields: list[str] = []
        self._csv_file: io.TextIOBase | None = None
        self._csv: csv.DictWriter | None = None
        if logger:
            # The file grows by appends; it is rewritten (whole, through a file swapped in) only when it must drop
            # rows: those past the resumed checkpoint, or those of another folder's run.
            continued = resume is not None and resume.folder.resolve() == self.logdir.resolve()
            if continued and header is not None:
                self._open_csv(header)
            else:
                self._csv_fields = list(dict.fromkeys(k for r in self.history for k in r))
                self._rewrite_csv()
        self._tb = self._open_tensorboard() if config.tensorboard and logger else None
        self._bar = self._open_progress() if config.progress and logger else None
        self._bar_steps = self.env_steps
        self._rate = (self.start, self.env_steps)
        self._trackers: list[Tracker] = []
        if not logger:
            return
        params = {"algo": algo, "algorithm": self.source, **config.to_dict(), "env_spec": dataclasses.asdict(spec),
                  "effective_target_return": self.target_return}
        write_whole(self.logdir / self.CONFIG_NAME, json.dumps(params, indent=2))
        try:
            self._trackers = open_trackers(config.track, self.logdir, params,
                                           resumed_from=None if resume is None else resume.folder)
        except BaseException:
            self.close()
            raise

    def _open_csv(self, fields: list[str]) -> None:
        """Opens ``progress.csv`` for appending rows of the columns ``fields`` (its header's)."""
        if self._csv_file is not None:
            self._csv_file.close()
        self._csv_fields = fields
        self._csv_file = open(self.logdir / self.CSV_NAME, "a", newline="")
        self._csv = csv.DictWriter(self._csv_file, fieldnames=fields, restval="")

    def _rewrite_csv(self) -> None:
        """Replaces ``progress.csv`` whole (:func:`~.run_folder.write_whole`) by the header of ``_csv_fields`` and
        every row of the history (no header while there are no columns), then appends to it."""
        text = io.StringIO(newline="")
        if self._csv_fields:
            writer = csv.DictWriter(text, fieldnames=self._csv_fields, restval="")
            writer.writeheader()
            writer.writerows(self.history)
        if self._csv_file is not None:
            self._csv_file.close()
        write_whole(self.logdir / self.CSV_NAME, text.getvalue())
        self._open_csv(self._csv_fields)

    def sync(self) -> None:
        """Flushes the rows written so far to the disk (``fsync``): at each checkpoint, so that the rows up to it
        outlast a power loss as the checkpoint does."""
        if self._csv_file is not None and not self._csv_file.closed:
            self._csv_file.flush()
            os.fsync(self._csv_file.fileno())

    def _open_tensorboard(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is an optional extra
            log.warning("tensorboard is not installed (pip install 'rlstruct[tensorboard]'); not writing events")
            return None
        return SummaryWriter(str(self.logdir))

    def _open_progress(self):
        try:
            from tqdm import tqdm
        except ImportError:
            log.warning("tqdm is not installed (pip install 'rlstruct[progress]'); no progress bar")
            return None
        return tqdm(total=self.config.max_env_steps, initial=self.env_steps, unit="step", unit_scale=True,
                    file=sys.stderr, dynamic_ncols=True, mininterval=0.5, desc=f"{self.algo} {self.config.env}")

    @property
    def diverged(self) -> dict[str, Any] | None:
        """The first non-finite training statistic or weight found (``{"quantity", "iteration", "value"}``), else
        ``None``: checked at every :meth:`flush`, so at most ``log_every`` iterations after it happened."""
        return self.guard.found

    @property
    def interrupted(self) -> bool:
        """Whether a signal interrupted the run (see :attr:`stop_signal`)."""
        return self.stop_signal is not None

    # ------------------------------------------------------------------ budget
    def elapsed(self) -> float:
        """Seconds since the run started (in this process: what ``time_limit`` bounds)."""
        return time.perf_counter() - self.start

    def wall_time(self) -> float:
        """Seconds of wall clock over every session of the run (a resumed run's earlier ones included)."""
        return self.wall_offset + self.elapsed()

    def budget_used(self) -> float:
        """The fraction of the step budget ``max_env_steps`` spent, in ``[0, 1]`` (0 without a budget).

        Schedules run over env steps, never over the wall clock, so that the same seed and settings give the same
        run on a loaded machine and an idle one (a schedule needs a budget: :func:`validate_run_config` checks it).
        """
        if self.config.max_env_steps is None:
            return 0.0
        return min(self.env_steps / self.config.max_env_steps, 1.0)

    def should_stop(self) -> bool:
        """True once the time limit or the env-step budget is spent, a confirmed evaluation reached the target, or
        the run was interrupted, diverged or lost a worker (:attr:`worker_failure`); :attr:`stop_reason` says which."""
        if self.diverged is not None:
            self.stop_reason = "diverged"
        elif self.worker_failure is not None:
            self.stop_reason = "worker_failed"
        elif self.interrupted:
            self.stop_reason = "signal"
        elif self.reached_target:
            self.stop_reason = "target"
        elif self.config.max_env_steps is not None and self.env_steps >= self.config.max_env_steps:
            self.stop_reason = "budget"
        elif self.elapsed() >= self.config.time_limit:
            self.stop_reason = "time_limit"
        else:
            self.stop_reason = None
        return self.stop_reason is not None

    # ------------------------------------------------------------------ rows
    def record(self, env_steps: int, stats: dict[str, torch.Tensor | float]) -> None:
        """Ends one training iteration of ``env_steps`` new env steps with its statistics."""
        self.iteration += 1
        self.env_steps += env_steps
        if self.startup_s is None:
            self.startup_s = self.elapsed()
        row = {"iteration": self.iteration, "env_steps": self.env_steps, "wall_time_s": self.wall_time(), **stats,
               **{k: f() for k, f in self.columns.items()}}
        self._pending.append(row)
        if self.iteration % self.config.log_every == 0:
            self.flush()

    def record_eval(self, result: dict[str, float], evaluator: Evaluator | None = None) -> None:
        """Logs an evaluation result (its own row, at the current iteration) and applies the stopping rule.

        Given the ``evaluator`` that gave it, during training: a periodic evaluation of trained weights whose mean
        reaches the target is a candidate, and ``evaluator`` evaluates the same weights again on fresh episodes
        next (:meth:`~.evaluation.Evaluator.confirm`); a confirmation whose mean reaches the target stops the run,
        which keeps those weights (:attr:`reached_target`, :attr:`kept_weights`), and one below lets it go on.
        """
        self.flush()
        self.last_eval = result["eval/return"]
        launched = int(result.get("eval/launch_env_steps", self.env_steps))
        self.last_eval_env_steps = launched
        confirmation = bool(result.get("eval/confirmation", 0.0))
        # The untrained network's evaluation does not count: on CartPole a random network can balance by luck. Nor
        # does one of a run that diverged (the flush above checked it).
        if (evaluator is not None and launched > 0 and self.diverged is None
                and reaches(self.last_eval, self.target_return)):
            assert evaluator.evaluated_weights is not None
            if confirmation:
                self.reached_target = True
                self.kept_weights, self.kept_env_steps = evaluator.evaluated_weights, launched
                if self.time_to_target_s is None:
                    self.time_to_target_s = self.elapsed()
            else:
                evaluator.confirm(evaluator.evaluated_weights, self.iteration, launched)
        row = {"iteration": self.iteration, "env_steps": self.env_steps, "wall_time_s": self.wall_time(), **result}
        self._write([row], tb_rows=[row])
        what = "confirmation of the evaluation" if confirmation else "evaluation"
        log.info("iteration %d, %d env steps: %s launched at %d env steps: return %.2f", self.iteration,
                 self.env_steps, what, launched, self.last_eval)

    def poll_evaluation(self, evaluator: Evaluator, weights: Callable[[], dict]) -> None:
        """Logs the result of ``evaluator`` if one is ready (never waits), then schedules the evaluations due
        (none once the run reached its target); ``weights`` gives the CPU state dict for the next evaluation."""
        result = evaluator.collect()
        if result is not None:
            self.record_eval(result, evaluator)
            if not result.get("eval/confirmation"):  # a confirmation repeats a launch step already reported
                for hook in self.evaluation_hooks:
                    hook(weights, self.env_steps)
                for callback in self.evaluation_callbacks:
                    callback(result)
        if not self.reached_target:
            evaluator.schedule(weights, self.iteration, self.env_steps)

    def flush(self) -> None:
        """Converts the pending rows and the watched weights' finiteness (one host sync), checks them
        (:attr:`diverged`) and writes the rows out."""
        flags = self.guard.weight_flags()
        if not self._pending and not flags:
            return
        rows, self._pending = self._pending, []
        tensors = [v for r in rows for v in r.values() if isinstance(v, torch.Tensor)] + list(flags.values())
        finite: dict[str, float] = {}
        if tensors:
            values = iter(torch.stack([t.detach().float().reshape(()) for t in tensors]).tolist())
            rows = [{k: next(values) if isinstance(v, torch.Tensor) else v for k, v in r.items()} for r in rows]
            finite = {k: next(values) for k in flags}
        self.guard.scan(rows, finite, self.iteration)
        if rows:
            self._write(rows, tb_rows=rows[-1:])

    def _write(self, rows: list[dict[str, Any]], tb_rows: list[dict[str, Any]]) -> None:
        self.history.extend(rows)
        if self._csv_file is None:  # not the logging rank
            return
        new = list(dict.fromkeys(k for r in rows for k in r if k not in self._csv_fields))
        if new and self._csv_fields:  # a new column (e.g. the first evaluation's): the file with the wider header
            self._csv_fields = self._csv_fields + new
            self._rewrite_csv()
        elif new:  # the first rows of an empty file
            self._open_csv(new)
            self._csv.writeheader()
            self._csv.writerows(rows)
        else:
            self._csv.writerows(rows)
        self._csv_file.flush()
        if rows:
            for tracker in self._trackers:
                tracker.log_rows(rows)
        if self._tb is not None:
            for r in tb_rows:
                step = int(r["env_steps"])
                for k, v in r.items():
                    if k not in ("iteration", "env_steps") and isinstance(v, (int, float)) and math.isfinite(v):
                        self._tb.add_scalar(k, v, step)
        if self._bar is not None and self.env_steps > self._bar_steps:
            self._bar.update(self.env_steps - self._bar_steps)
            self._bar_steps = self.env_steps
            now = time.perf_counter()
            sps = (self.env_steps - self._rate[1]) / max(now - self._rate[0], 1e-9)
            self._rate = (now, self.env_steps)
            post = {"it": self.iteration, "steps/s": f"{sps:,.0f}"}
            if self.last_eval is not None:
                post["eval"] = f"{self.last_eval:.1f}"
            self._bar.set_postfix(post, refresh=False)

    def close(self) -> None:
        """Flushes (to the disk) and closes the CSV, TensorBoard and the progress bar; idempotent."""
        if self._csv_file is None or self._csv_file.closed:
            return
        self.flush()
        self.sync()
        self._csv_file.close()
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()

    def report(self, summary: dict[str, Any], files: list[str | Path | None]) -> None:
        """Sends the run's final ``summary`` and ``files`` (the checkpoint, the curve, the videos; ``None``: not
        written) to its trackers (``--track``), then ends their tracked runs."""
        for tracker in self._trackers:
            tracker.log_summary(summary)
            for path in files:
                if path is not None:
                    tracker.log_artifact(Path(path))
        self.end_trackers()

    def end_trackers(self, *, failed: bool = False) -> None:
        """Ends the tracked runs of ``--track`` (as failed: training raised); idempotent."""
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close(failed=failed)

    def poll_checkpoint(self, model: nn.Module, learner_state: Callable[[], dict[str, Any]]) -> None:
        """Writes the checkpoint (``model``'s weights, the counters, ``learner_state()``) when the iteration just
        recorded is a multiple of ``config.checkpoint_every``, with ``progress.csv`` written up to it first and flushed
        to the disk (a resumed run reads its rows back). The file is replaced atomically: a kill during the write
        leaves the previous checkpoint."""
        every = self.config.checkpoint_every
        if not every or self.iteration % every or not self.logger:
            return
        self.flush()
        if self.diverged is not None:  # never a checkpoint of non-finite weights: the previous one stays
            return
        self.sync()
        self.save_checkpoint(model, learner_state(), eval_return=math.nan if self.last_eval is None else self.last_eval)

    def save_checkpoint(self, model: nn.Module, learner: dict[str, Any], *, eval_return: float,
                        interrupted: bool = False, wall_time_s: float | None = None,
                        stop_reason: str | None = None) -> str:
        """Writes ``checkpoint.pt`` into the log folder: ``model``'s weights, the counters and ``learner`` (what a
        resumed run restores besides the weights); returns its path.

        Args:
            model: the policy's network.
            learner: the learner's state (optimizers, normalisers, targets), on the CPU.
            eval_return: the last evaluation's mean return (nan: none).
            interrupted: whether a signal stopped the run.
            wall_time_s: the run's wall time over every session (default: now).
            stop_reason: why the run stopped (its final checkpoint; ``None``: a periodic one): ``--resume`` of a
                finished run is refused (:func:`~.run_folder.check_unfinished`).
        """
        return save_checkpoint(self.logdir / CHECKPOINT_NAME, self.algo, self.config, self.spec, model,
                               {"env_steps": self.env_steps, "iteration": self.iteration,
                                "wall_time_s": self.wall_time() if wall_time_s is None else wall_time_s,
                                "eval_return": eval_return, "interrupted": interrupted, "learner": learner,
                                "world_size": self.world_size, "stop_reason": stop_reason, "algorithm": self.source})


def _earlier_rows(resume: Resume) -> tuple[list[dict[str, Any]], list[str] | None]:
    """The rows of ``progress.csv`` in the folder of ``resume``'s checkpoint up to its iteration (a copy of the
    file, or a run killed after its checkpoint, may hold later ones), as numbers; none when the file is gone.

    Returns:
        ``(rows, header)``: ``header``, the file's columns, when it holds those rows and nothing else (no later row,
        no line cut by a kill), so that the resumed run may append to it; else ``None``.

    Raises:
        RunRecordError: the file has no header (its first line is not the columns' names), a cell that is not a number
            (the message names the line and the column), or a training iteration's row twice or out of order (two
            processes wrote it, or a hand edit): a run record the resumed run would continue wrong, left as it is.
    """
    path = resume.folder / Run.CSV_NAME
    if not path.is_file():
        log.warning("%s is missing: progress.csv of the resumed run starts at iteration %d", path, resume.iteration + 1)
        return [], None
    with open(path, newline="") as f:
        text = f.read()
    whole = text.endswith("\n")
    if not whole:  # a line cut by a kill while it was written: the rows before it are whole
        text = text[:text.rfind("\n") + 1]
    fix = f"correct {path} (or move it away: the resumed run's progress.csv then starts at iteration " \
          f"{resume.iteration + 1}), then resume again"
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
