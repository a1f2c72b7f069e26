"""The record of one training run (:class:`Run`): its counters and clock, its rows (written to its folder, its
trackers and the progress bar as they are converted), its evaluations (recorded, judged by its stop rule and
announced to the listeners of its evaluation event) and its checkpoints' turn.

A run given a :class:`~.checkpoints.Resume` (``--resume``) continues the counters, the log folder and
``progress.csv`` of the run that wrote it, with seeds of its own (:func:`session_seed`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos._train.checkpoints import Resume
from rlstruct.algos._train.compile_cache import CompileMeter
from rlstruct.algos._train.config import RunConfig
from rlstruct.algos._train.events import Evaluated, Event
from rlstruct.algos._train.folder_claim import run_logdir
from rlstruct.algos._train.registry import run_code
from rlstruct.algos._train.run_folder import RunFolder, earlier_rows
from rlstruct.algos._train.seeds import session_seed
from rlstruct.algos._train.stop_rule import StopRule
from rlstruct.algos._train.trackers import Trackers, open_trackers
from rlstruct.algos._train.video import RunVideos

if TYPE_CHECKING:
    from rlstruct.algos._train.evaluation import Evaluator

__all__ = ["Run"]

log = logging.getLogger(__name__)


class Run:
    """The record of one training run: its counters and clock, its rows and its evaluations.

    Rows are recorded once per iteration with statistics that may still be tensors on the learner device; every
    ``log_every`` iterations (and at each evaluation) they are converted together, with one host sync, checked for a
    divergence (the stop rule's :attr:`~.stop_rule.StopRule.guard`), appended to :attr:`history` and announced to
    :attr:`written`'s listeners: on the logging process, the run's folder (``progress.csv``, TensorBoard:
    :class:`~.run_folder.RunFolder`), its trackers and the progress bar.

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
            ``config.json``) and has its trackers: rank 0 of a data-parallel run does, the other ranks only count.
        world_size: the data-parallel ranks of the run (1: one process).
        source: where the algorithm came from (``"a2c"``, ``"mylab.myalgo:ALGORITHM"``; default: ``algo``): what
            ``config.json`` and the checkpoints record as ``"algorithm"``, for the commands that rebuild the run.
        on_evaluation: more listeners of :attr:`evaluated`, after the run's videos (a sweep's pruning).

    Attributes:
        seed: the seed of this session's envs, agents and generators (:func:`session_seed`).
        stop_rule: when the run stops, and why (:class:`~.stop_rule.StopRule`).
        written: the rows as they are written (each news a list of rows, numbers, the last ones of :attr:`history`).
        evaluated: the evaluations whose results come back during training (:class:`~.events.Evaluated`; not a
            target's confirmation): the run's videos (``--video-every``) and a sweep's pruning listen; an exception a
            listener raises ends the run.
        folder: the run's folder (``None`` on a rank that does not log).
        trackers: the run's trackers (``--track``; none on a rank that does not log).
        videos: the run's videos (``--video-every``), else ``None``.
        startup_s: seconds from ``start`` to the end of this session's first training iteration (None before).
    """

    def __init__(self, algo: str, config: RunConfig, spec: EnvSpec, *, start: float | None = None,
                 resume: Resume | None = None, logger: bool = True, world_size: int = 1, source: str | None = None,
                 on_evaluation: Iterable[Callable[[Evaluated], None]] = ()):
        self.algo = algo
        self.source = source or algo
        #: the modules the run imports and the installed distributions holding them (:func:`~.registry.run_code`)
        self.code = run_code(self.source, config.to_dict()) if logger else {}
        #: the data-parallel ranks of the run (recorded in its checkpoints)
        self.world_size = world_size
        self.config = config
        self.spec = spec
        self.start = time.perf_counter() if start is None else start
        self.logdir = run_logdir(algo, config, resume)
        self.env_steps = 0 if resume is None else resume.env_steps
        self.iteration = 0 if resume is None else resume.iteration
        self.seed = session_seed(config.seed, self.iteration)
        #: the wall time of the earlier sessions of a resumed run: rows count ``wall_time_s`` over all of them
        self.wall_offset = 0.0 if resume is None else resume.wall_time_s
        earlier, header = ([], None) if resume is None else earlier_rows(resume)
        self.history: list[dict[str, float]] = earlier
        #: more columns of every training row: name -> what gives its value at the row's end
        self.columns: dict[str, Callable[[], float]] = {}
        self.stop_rule = StopRule(config, spec, clock=self.elapsed)
        self.written: Event[list[dict[str, Any]]] = Event()
        self.videos = None if not config.video_every else RunVideos(
            config.video_every, self.logdir, algo=self.source, config=config.to_dict(), spec=spec, seed=self.seed)
        self.evaluated: Event[Evaluated] = Event([] if self.videos is None else [self.videos.after_evaluation])
        for listener in on_evaluation:
            self.evaluated.subscribe(listener)
        #: the mean return of the last evaluation recorded (None before)
        self.last_eval: float | None = None
        #: the env steps at which the weights of :attr:`last_eval` were taken for their evaluation
        self.last_eval_env_steps: int | None = None
        self.startup_s: float | None = None
        #: what torch.compile did in this process during the run (seconds, cache hits): the summary's ``compile``
        self.compile_meter = CompileMeter()
        self._pending: list[dict[str, Any]] = []
        self.folder: RunFolder | None = None
        self.trackers = Trackers()
        self._bar: _ProgressBar | None = None
        if not logger:
            return
        # progress.csv grows by appends; it is rewritten (whole) only when it must drop rows: those past the resumed
        # checkpoint, or those of another folder's run.
        continued = resume is not None and resume.folder.resolve() == self.logdir.resolve()
        self.folder = RunFolder(self.logdir, rows=self.history, header=header if continued else None,
                                tensorboard=config.tensorboard,
                                resumed_env_steps=None if resume is None else resume.env_steps)
        self.written.subscribe(self.folder.write_rows)
        if config.progress:
            self._bar = _ProgressBar.open(f"{algo} {config.env}", config.max_env_steps, self.env_steps, self.start)
        if self._bar is not None:
            self.written.subscribe(self._bar.show)
        params = {"algo": algo, "algorithm": self.source, "code": self.code, **config.to_dict(),
                  "env_spec": dataclasses.asdict(spec), "effective_target_return": self.stop_rule.target_return}
        self.folder.write_config(params)
        try:
            self.trackers = Trackers(open_trackers(config.track, self.logdir, params,
                                                   resumed_from=None if resume is None else resume.folder))
        except BaseException:
            self.close()
            raise
        self.written.subscribe(self.trackers.log_rows)

    @property
    def logger(self) -> bool:
        """Whether this process writes the run's files (rank 0 of a data-parallel run; a plain run always)."""
        return self.folder is not None

    # ------------------------------------------------------------------ clock and budget
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
        """Whether the loop stops now (:meth:`~.stop_rule.StopRule.should_stop` at the run's env steps)."""
        return self.stop_rule.should_stop(self.env_steps)

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
        """Logs an evaluation result (its own row, at the current iteration); given the ``evaluator`` that gave it,
        during training, the stop rule judges it against the target (:meth:`~.stop_rule.StopRule.judge`)."""
        self.flush()  # the rows before it, and a divergence they show: an evaluation of diverged weights never counts
        self.last_eval = result["eval/return"]
        launched = int(result.get("eval/launch_env_steps", self.env_steps))
        self.last_eval_env_steps = launched
        if evaluator is not None:
            self.stop_rule.judge(result, launched, evaluator, self.iteration)
        self._write([{"iteration": self.iteration, "env_steps": self.env_steps, "wall_time_s": self.wall_time(),
                      **result}])
        what = "confirmation of the evaluation" if result.get("eval/confirmation") else "evaluation"
        log.info("iteration %d, %d env steps: %s launched at %d env steps: return %.2f", self.iteration,
                 self.env_steps, what, launched, self.last_eval)

    def poll_evaluation(self, evaluator: Evaluator, weights: Callable[[], dict]) -> None:
        """Logs the result of ``evaluator`` if one is ready (never waits) and announces it (:attr:`evaluated`), then
        schedules the evaluations due (none once the run reached its target); ``weights`` gives the CPU state dict
        for the next evaluation."""
        result = evaluator.collect()
        if result is not None:
            self.record_eval(result, evaluator)
            if not result.get("eval/confirmation"):  # a confirmation repeats a launch step already announced
                self.evaluated.publish(Evaluated(row=result, env_steps=self.env_steps, weights=weights))
        if not self.stop_rule.reached_target:
            evaluator.schedule(weights, self.iteration, self.env_steps)

    def flush(self) -> None:
        """Converts the pending rows and the watched weights' finiteness (one host sync), checks them
        (:attr:`~.stop_rule.StopRule.diverged`) and writes the rows out."""
        guard = self.stop_rule.guard
        flags = guard.weight_flags()
        if not self._pending and not flags:
            return
        rows, self._pending = self._pending, []
        tensors = [v for r in rows for v in r.values() if isinstance(v, torch.Tensor)] + list(flags.values())
        finite: dict[str, float] = {}
        if tensors:
            values = iter(torch.stack([t.detach().float().reshape(()) for t in tensors]).tolist())
            rows = [{k: next(values) if isinstance(v, torch.Tensor) else v for k, v in r.items()} for r in rows]
            finite = {k: next(values) for k in flags}
        guard.scan(rows, finite, self.iteration)
        if rows:
            self._write(rows)

    def _write(self, rows: list[dict[str, Any]]) -> None:
        self.history.extend(rows)
        self.written.publish(rows)

    def close(self) -> None:
        """Writes out the pending rows and closes the run's folder (its files flushed to the disk) and the progress
        bar; idempotent, and nothing on a rank that does not log."""
        if self.folder is None or self.folder.closed:
            return
        self.flush()
        self.folder.close()
        if self._bar is not None:
            self._bar.close()

    # ------------------------------------------------------------------ checkpoints
    def poll_checkpoint(self, model: nn.Module, learner_state: Callable[[], dict[str, Any]]) -> None:
        """Writes the checkpoint (``model``'s weights, the counters, ``learner_state()``) when the iteration just
        recorded is a multiple of ``config.checkpoint_every``, with ``progress.csv`` written up to it first and flushed
        to the disk (a resumed run reads its rows back). The file is replaced atomically: a kill during the write
        leaves the previous checkpoint."""
        every = self.config.checkpoint_every
        if not every or self.iteration % every or self.folder is None:
            return
        self.flush()
        if self.stop_rule.diverged is not None:  # never a checkpoint of non-finite weights: the previous one stays
            return
        self.folder.sync()
        self.save_checkpoint(model, learner_state(), eval_return=math.nan if self.last_eval is None else self.last_eval)

    def save_checkpoint(self, model: nn.Module, learner: dict[str, Any], *, eval_return: float,
                        interrupted: bool = False, wall_time_s: float | None = None,
                        stop_reason: str | None = None) -> str:
        """Writes ``checkpoint.pt`` into the run's folder: ``model``'s weights, the counters and ``learner`` (what a
        resumed run restores besides the weights); returns its path.

        Args:
            model: the policy's network.
            learner: the learner's state (optimizers, normalisers, targets), on the CPU.
            eval_return: the last evaluation's mean return (nan: none).
            interrupted: whether a signal stopped the run.
            wall_time_s: the run's wall time over every session (default: now).
            stop_reason: why the run stopped (its final checkpoint; ``None``: a periodic one): ``--resume`` of a
                finished run is refused (:func:`~.folder_claim.check_unfinished`).
        """
        assert self.folder is not None, "the logging rank writes the checkpoints"
        return self.folder.write_checkpoint(
            self.algo, self.config, self.spec, model,
            {"env_steps": self.env_steps, "iteration": self.iteration,
             "wall_time_s": self.wall_time() if wall_time_s is None else wall_time_s, "eval_return": eval_return,
             "interrupted": interrupted, "learner": learner, "world_size": self.world_size,
             "stop_reason": stop_reason, "algorithm": self.source, "code": self.code})


class _ProgressBar:
    """The progress bar of a run on the terminal (tqdm): the env steps against the budget, the iteration, the env
    steps per second since the last rows and the last evaluation's return, updated as rows are written."""

    def __init__(self, bar: Any, env_steps: int, start: float):
        self._bar, self._steps, self._rate = bar, env_steps, (start, env_steps)
        self._last_eval: float | None = None

    @classmethod
    def open(cls, name: str, total: int | None, env_steps: int, start: float) -> _ProgressBar | None:
        """The bar of the run ``name`` of ``total`` env steps (``None``: no budget), at ``env_steps`` since
        ``start``; ``None`` without tqdm (a warning says so)."""
        try:
            from tqdm import tqdm
        except ImportError:
            log.warning("tqdm is not installed (pip install 'rlstruct[progress]'); no progress bar")
            return None
        return cls(tqdm(total=total, initial=env_steps, unit="step", unit_scale=True, file=sys.stderr,
                        dynamic_ncols=True, mininterval=0.5, desc=name), env_steps, start)

    def show(self, rows: list[dict[str, Any]]) -> None:
        """Moves the bar to the last of ``rows`` (the run's counters), keeping the last evaluation's return."""
        for row in rows:
            if "eval/return" in row:
                self._last_eval = row["eval/return"]
        env_steps = int(rows[-1]["env_steps"])
        if env_steps <= self._steps:
            return
        self._bar.update(env_steps - self._steps)
        self._steps = env_steps
        now = time.perf_counter()
        sps = (env_steps - self._rate[1]) / max(now - self._rate[0], 1e-9)
        self._rate = (now, env_steps)
        post = {"it": rows[-1]["iteration"], "steps/s": f"{sps:,.0f}"}
        if self._last_eval is not None:
            post["eval"] = f"{self._last_eval:.1f}"
        self._bar.set_postfix(post, refresh=False)

    def close(self) -> None:
        """Closes the bar."""
        self._bar.close()
