"""How a training run ends: its final evaluation, checkpoint, learning curve and ``summary.json``
(:func:`finish_training`), or, for a run that diverged, the same record without a final evaluation or a checkpoint
of its weights (:func:`finish_diverged`), an error its divergence explains suppressed
(:func:`explained_by_divergence`). What finds the divergence is :class:`~.finite.DivergenceGuard`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from torch import nn

from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME
from rlstruct.algos._train.evaluation import Evaluator
from rlstruct.algos._train.log import Run
from rlstruct.algos._train.presets import preset_target
from rlstruct.algos._train.result import TrainResult
from rlstruct.devices import cpu_state_dict

__all__ = ["explained_by_divergence", "finish_diverged", "finish_training"]

log = logging.getLogger(__name__)


def explained_by_divergence(run: Run) -> Callable[..., bool]:
    """The exit function that suppresses an exception of a run found diverged, recording it beside what diverged."""

    def exit_(kind: type[BaseException] | None, error: BaseException | None, traceback: Any) -> bool:
        found = run.stop_rule.diverged
        if not isinstance(error, Exception) or found is None:
            return False
        found["error"] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
        return True

    return exit_


def _result(run: Run, wall: float, *, logged: bool, **fields: Any) -> TrainResult:
    """The result of ``run`` after ``wall`` seconds of this session: its counters, history and stop, and, ``logged``
    (the result the logging process reports), its target, preset, start-up and compilation; ``fields`` hold the
    rest, and win."""
    rule = run.stop_rule
    known = {"env_steps": run.env_steps, "wall_time_s": wall, "history": run.history, "logdir": str(run.logdir),
             "iterations": run.iteration, "interrupted": rule.interrupted, "stop_signal": rule.signal,
             "world_size": run.world_size, "run_wall_time_s": run.wall_offset + wall,
             "max_env_steps": run.config.max_env_steps}
    if logged:
        known.update(target_return=rule.target_return, preset=run.config.preset, startup_s=run.startup_s,
                     preset_target=preset_target(run.config.preset), compile=run.compile_meter.read())
    return TrainResult(**{**known, **fields})


def finish_diverged(run: Run, *, title: str) -> TrainResult:
    """The end of a run that diverged (its stop rule's ``diverged``): no final evaluation (``eval_return`` nan,
    ``reached_target`` False) and no checkpoint of its weights; the checkpoint in its log folder, written before the
    divergence (``checkpoint_every``, or the one it resumed), is kept and named. The learning curve and
    ``summary.json`` (``stop_reason`` ``"diverged"`` and what diverged) are written as for any run.
    """
    found = run.stop_rule.diverged
    assert found is not None, "finish_diverged ends a run that diverged"
    run.close()
    kept = run.logdir / CHECKPOINT_NAME
    checkpoint = str(kept) if run.logger and kept.is_file() else None
    result = _result(run, run.elapsed(), logged=True, eval_return=math.nan, checkpoint=checkpoint,
                     stop_reason="diverged", diverged=found)
    if run.folder is None:
        return result
    error = f"; then {found['error']}" if "error" in found else ""
    log.warning("the run diverged: %s was %s at iteration %d (found at iteration %d, %d env steps%s): no final "
                "evaluation, no checkpoint of its weights (kept: %s); lower --lr or clip the gradients, and train "
                "again", found["quantity"], found["value"], found["iteration"], run.iteration, run.env_steps, error,
                checkpoint or "none")
    result.plot = run.folder.write_curve(run.history, f"{title} on {run.config.env} ({run.config.backend}), seed "
                                                      f"{run.config.seed}, diverged")
    run.folder.write_summary(result.summary())
    run.trackers.report(result.summary(), [result.plot])
    return result


def _decide_the_evaluations_due(run: Run, evaluator: Evaluator) -> None:
    """Runs the evaluations still under way or queued, in order, each recorded under the stopping rule as during
    training (a candidate's confirmation runs next), until one confirms the target. With evaluation workers these
    are the ones whose results had not come back when training stopped; in process, the last one launched: the
    same evaluations decide in both modes, whatever the workers' speed."""
    while not run.stop_rule.reached_target and (evaluator.pending or evaluator.queued):
        run.record_eval(evaluator.next_result(), evaluator)


def finish_training(run: Run, evaluator: Evaluator, model: nn.Module, spec: EnvSpec, *, title: str,
                    learner: dict[str, Any] | None = None) -> TrainResult:
    """The end of every ``train``: final evaluation, checkpoint, learning curve, ``summary.json`` and result.

    ``progress.csv``, the checkpoint and ``summary.json`` reach the disk in that order (each flushed with ``fsync``,
    the last two written whole through a file renamed onto them): the record outlasts a kill or a power loss.

    On a rank that does not log (ranks 1 and up of a data-parallel run), only the result: what the run counted,
    and no evaluation (``eval_return`` nan); rank 0 evaluates, checkpoints and reports.

    The checkpoint holds ``model``'s weights, the counters (``iteration``, ``env_steps``, ``wall_time_s`` over every
    session) and ``learner``, what a resumed run restores (see
    :func:`~rlstruct.algos._train.checkpoints.load_resume`).

    A run stopped at its target (a confirmation cleared it: see :meth:`~.stop_rule.StopRule.judge`) keeps the weights
    that were confirmed (not those of the iterations since) and reports the confirmation's return: no further
    evaluation runs that could disagree. Otherwise the evaluations due are run (the queue of
    :class:`~.evaluation.Evaluator`) under the same stopping rule (a candidate among them gets its confirmation,
    which may stop the run at its target as above), and the final weights are evaluated again on fresh episodes,
    whose return is reported. An interrupted run (a signal), or one whose batcher worker failed with no restart left
    (``stop_reason`` ``"worker_failed"``), skips those: it keeps an evaluation
    that has already finished, if any (none after a worker's failure), and its result's ``eval_return`` is the
    last evaluation's (nan if none). In every case ``reached_target`` is ``eval_return >= target_return``, and
    ``eval_env_steps`` says at which env steps the weights reported on were taken.
    A run found diverged (checked first, with the rows since the last check and the weights) ends
    by :func:`finish_diverged` instead: no final evaluation, no checkpoint of its weights.

    Args:
        run: the run, still open (this closes it).
        evaluator: the run's evaluator.
        model: the learner's model.
        spec: the env's description.
        title: the algorithm's name in the plot's title, e.g. ``"A2C"``.
        learner: the learner's state at the end of training besides ``model``'s weights (``{"optimizer":
            optimizer.state_dict(), ...}``: plain types and tensors, copied to the CPU).
    """
    run.flush()  # the rows since the last check, and the weights: a run that diverged ends here
    rule = run.stop_rule
    if rule.diverged is not None:
        if rule.worker_failure is not None:  # what the diverged weights made a worker do, as for an error raised
            rule.diverged.setdefault("error", f"BatcherWorkerError: {rule.worker_failure['error']}")
        return finish_diverged(run, title=title)
    # What stopped the run, read now: a first signal during the evaluations below lets them end, and stopped nothing.
    config, interrupted, failure = run.config, rule.interrupted, rule.worker_failure
    # A rank whose own check did not say stop was stopped by another's vote.
    stop_reason = ("worker_failed" if failure is not None else "signal" if interrupted
                   else rule.reason or "another_rank")
    # A signal or a worker's failure stops the run where it is: no evaluation runs after it.
    halted = interrupted or failure is not None
    if run.folder is None:
        run.close()
        return _result(run, run.elapsed(), logged=False, eval_return=math.nan, interrupted=interrupted,
                       stop_reason=stop_reason, worker_failure=failure)
    if run.iteration == 0 and stop_reason == "time_limit":
        log.warning("no training iteration ran: the time limit (%g s) was spent before the first one (setup, "
                    "compilation, the first evaluation); what follows evaluates the untrained policy, a run that "
                    "rlstruct compare does not count. Raise --time-limit, or drop it", config.time_limit)
    if halted:
        # After a worker's failure the evaluator's batcher may be the failed one: nothing is collected from it.
        finished = evaluator.collect() if failure is None else None
        if finished is not None:
            run.record_eval(finished)
        eval_return = math.nan if run.last_eval is None else run.last_eval
        eval_env_steps = run.last_eval_env_steps
    else:
        if stop_reason != "target":
            _decide_the_evaluations_due(run, evaluator)
            stop_reason = "target" if rule.reached_target else stop_reason
        if stop_reason == "target":
            assert rule.kept_weights is not None and run.last_eval is not None
            model.load_state_dict(rule.kept_weights)
            eval_return, eval_env_steps = run.last_eval, rule.kept_env_steps
        else:
            _, final = evaluator.final(cpu_state_dict(model), run.iteration, run.env_steps)
            run.record_eval(final)
            eval_return, eval_env_steps = final["eval/return"], run.env_steps
    if run.videos is not None and not halted:  # the policy kept: the one confirmed at the target, or the final one
        run.videos.record(cpu_state_dict(model), run.env_steps)
    wall = run.elapsed()
    run.close()
    checkpoint = run.save_checkpoint(model, learner or {}, eval_return=eval_return, interrupted=interrupted,
                                     wall_time_s=run.wall_offset + wall, stop_reason=stop_reason)
    suffix = ", interrupted" if interrupted else ", a worker failed" if failure is not None else ""
    plot = run.folder.write_curve(run.history, f"{title} on {config.env} ({config.backend}), seed {config.seed}"
                                               f"{suffix}")
    result = _result(run, wall, logged=True, eval_return=eval_return, checkpoint=checkpoint, plot=plot,
                     interrupted=interrupted, time_to_target_s=rule.time_to_target_s, stop_reason=stop_reason,
                     eval_env_steps=eval_env_steps, worker_failure=failure)
    run.folder.write_summary(result.summary())
    run.trackers.report(result.summary(), [checkpoint, plot, *(run.videos.paths if run.videos is not None else [])])
    return result
