"""What a run reports: why it stopped (:data:`STOP_REASONS`), its result (:class:`TrainResult`, whose
``summary()`` is ``summary.json``), whether it stopped before its step budget (:func:`stopped_early`), and whether a
return reaches a target (:func:`reaches`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["STOP_REASONS", "TrainResult", "reaches", "stopped_early"]


#: why a run stops (:attr:`TrainResult.stop_reason`), checked in this order
STOP_REASONS = ("diverged", "worker_failed", "signal", "target", "budget", "time_limit", "another_rank")
#: how :func:`stopped_early` names each reason that cuts a run before its step budget
_CUT_BY = {"diverged": "diverged", "worker_failed": "a batcher worker failed", "signal": "a signal",
           "time_limit": "its time limit", "another_rank": "another rank stopped it"}


@dataclasses.dataclass(kw_only=True)
class TrainResult:
    """What :func:`train` returns, built by keyword (``TrainResult(eval_return=..., env_steps=..., ...)``).

    Attributes:
        eval_return: the mean return the run reports: of the confirmation that stopped it at its target (the
            weights kept are the ones it evaluated), else of the final (blocking) evaluation of the final policy, or,
            for an interrupted run, of the last evaluation that finished (nan if none).
        env_steps: training environment steps taken.
        wall_time_s: seconds from the start of ``train`` to the end of the final evaluation: this session's.
        history: one dict per training iteration (and per evaluation), as in ``progress.csv``.
        logdir: where the logs, plot and checkpoint are.
        iterations: training iterations done.
        checkpoint: path of ``checkpoint.pt``.
        plot: path of the learning-curve PNG (``None`` without matplotlib).
        target_return: the return that stops training (``target_return``, else the preset's target, else the env's
            threshold: :func:`~.stop_rule.run_target`), or ``None``.
        reached_target: exactly ``eval_return >= target_return`` (False without a target or a number): computed
            from those two, whatever value is passed.
        eval_env_steps: the env steps at which the weights that ``eval_return`` is about were taken for their
            evaluation (``env_steps`` for a final evaluation; earlier for a target's confirmation or an interrupted
            run's last evaluation); None without a number.
        interrupted: whether a Ctrl-C (SIGINT) or a SIGTERM stopped training early; ``eval_return`` is then the
            last evaluation's (nan if none finished): the final evaluation is skipped.
        stop_signal: the signal that did (``"SIGINT"``, ``"SIGTERM"``), else ``None``.
        stop_reason: why training stopped, one of :data:`STOP_REASONS`: ``"diverged"`` (a loss, a gradient norm or
            a weight turned NaN or infinite: ``diverged`` says which), ``"target"`` (an evaluation reached
            ``target_return`` and its confirmation on fresh episodes did too), ``"budget"`` (``max_env_steps``
            spent), ``"time_limit"`` (``time_limit`` seconds spent), ``"signal"`` (``stop_signal``),
            ``"worker_failed"`` (a batcher worker failed with no restart left: ``worker_failure`` says which),
            ``"another_rank"`` (a data-parallel run's other rank stopped it).
        preset: the preset whose settings the run used (``"none"``: the bare defaults and the settings given).
        startup_s: seconds from the launch (the process's start for ``rlstruct train``, the call for ``train``) to
            the end of this session's first training iteration (None: none ended).
        time_to_target_s: seconds from the launch to the end of the confirmation that stopped the run at its target
            (None: none did in this session).
        world_size: the ranks that trained it (``torchrun``: data-parallel learners; 1 for a plain run).
        preset_target: the return ``preset`` is tuned to reach within its budget (its learning benchmark's target,
            as ``rlstruct presets`` lists it), or ``None``; the run stops at it when it is ``target_return``.
        diverged: for a run that diverged, ``{"quantity", "iteration", "value"}`` of the first non-finite value
            found (:class:`~.finite.DivergenceGuard`); its ``eval_return`` is nan (no evaluation of it counts),
            ``reached_target`` False, and ``checkpoint`` the one written before the divergence, if any.
        worker_failure: for a run stopped by a batcher worker's failure, ``{"worker_id", "error", "traceback"}``
            (the error's first line, and the traceback the worker sent, ``None`` for one that died); the run ended
            as for a signal: no final evaluation, its checkpoint written to resume from.
        run_wall_time_s: seconds of wall clock over every session of the run (the earlier sessions' as the
            checkpoint it resumed counted them, plus this one's; ``progress.csv``'s ``wall_time_s`` counts alike);
            ``wall_time_s`` for a run never resumed; ``None`` where not given.
        compile: what ``torch.compile`` did in this session (:meth:`~.compile_cache.CompileMeter.read`: ``seconds``
            compiling, and the hits and misses of inductor's and AOTAutograd's on-disk caches: a second launch of a
            compiled run hits them); ``None`` where not given.
        max_env_steps: the run's step budget (``None``: none, or not given); ``summary()`` adds ``stopped_early``
            (:func:`stopped_early`), which says a run stopped before it is no result to compare.
    """

    eval_return: float
    env_steps: int
    wall_time_s: float
    history: list[dict[str, float]]
    logdir: str
    iterations: int = 0
    checkpoint: str | None = None
    plot: str | None = None
    target_return: float | None = None
    reached_target: bool = False
    interrupted: bool = False
    stop_signal: str | None = None
    preset: str = "none"
    startup_s: float | None = None
    time_to_target_s: float | None = None
    world_size: int = 1
    stop_reason: str = "budget"
    preset_target: float | None = None
    diverged: dict[str, Any] | None = None
    eval_env_steps: int | None = None
    run_wall_time_s: float | None = None
    worker_failure: dict[str, Any] | None = None
    compile: dict[str, Any] | None = None
    max_env_steps: int | None = None

    def __post_init__(self) -> None:
        self.reached_target = reaches(self.eval_return, self.target_return)

    def summary(self) -> dict[str, Any]:
        """The JSON-able fields (everything but the history)."""
        return {
            "eval_return": self.eval_return,
            "eval_env_steps": self.eval_env_steps,
            "env_steps": self.env_steps,
            "wall_time_s": round(self.wall_time_s, 3),
            "run_wall_time_s": None if self.run_wall_time_s is None else round(self.run_wall_time_s, 3),
            "logdir": self.logdir,
            "iterations": self.iterations,
            "checkpoint": self.checkpoint,
            "plot": self.plot,
            "target_return": self.target_return,
            "reached_target": self.reached_target,
            "interrupted": self.interrupted,
            "stop_signal": self.stop_signal,
            "preset": self.preset,
            "startup_s": None if self.startup_s is None else round(self.startup_s, 3),
            "time_to_target_s": None if self.time_to_target_s is None else round(self.time_to_target_s, 3),
            "world_size": self.world_size,
            "stop_reason": self.stop_reason,
            "preset_target": self.preset_target,
            "diverged": self.diverged,
            "worker_failure": self.worker_failure,
            "compile": self.compile,
            "max_env_steps": self.max_env_steps,
            "stopped_early": stopped_early(self.stop_reason, self.env_steps, self.max_env_steps),
        }


def reaches(value: float | None, target: float | None) -> bool:
    """Whether a mean return ``value`` is at or above ``target`` (False when either is missing or nan).

    >>> reaches(475.0, 475.0), reaches(474.9, 475.0), reaches(float("nan"), 475.0), reaches(500.0, None)
    (True, False, False, False)
    """
    return value is not None and target is not None and not math.isnan(value) and value >= target


def stopped_early(stop_reason: str | None, env_steps: float | None, max_env_steps: int | None) -> str | None:
    """``"stopped at X of Y env steps (why)"`` for a run that stopped before its step budget ``max_env_steps`` for
    any reason but its target (a time limit, a signal, a worker's failure, a divergence, another rank): such a run
    is no result, since where it stopped depends on the machine or on chance. ``None`` for a run that reached its
    target or spent its budget, or whose ``stop_reason`` is not recorded. ``env_steps`` None: not recorded.

    >>> stopped_early("time_limit", 0, 100_000)
    'stopped at 0 of 100,000 env steps (its time limit)'
    >>> stopped_early("time_limit", 2_048, None)
    'stopped at 2,048 env steps, with no step budget (its time limit)'
    >>> stopped_early("budget", 100_352, 100_000), stopped_early("target", 5_000, 100_000)
    (None, None)
    """
    if stop_reason in (None, "target", "budget") or (
            env_steps is not None and max_env_steps is not None and env_steps >= max_env_steps):
        return None
    why = _CUT_BY.get(stop_reason, stop_reason)
    if env_steps is None:
        where = "with no step budget" if max_env_steps is None else f"before its budget of {max_env_steps:,} env steps"
    else:
        where = (f"at {int(env_steps):,} env steps, with no step budget" if max_env_steps is None
                 else f"at {int(env_steps):,} of {max_env_steps:,} env steps")
    return f"stopped {where} ({why})"
