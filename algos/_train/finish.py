"""How a training run ends: its final evaluation, checkpoint, learning curve and ``summary.json``
(:func:`finish_training`), or, for a run that diverged, the same record without a final evaluation or a checkpoint
of its weights (:func:`finish_diverged`), an error its divergence explains suppressed
(:func:`explained_by_divergence`). What finds the divergence is :class:`~.finite.DivergenceGuard`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Any

from torch import nn

from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME, plot_learning_curve
from rlstruct.algos._train.evaluation import Evaluator
from rlstruct.algos._train.log import Run
from rlstruct.algos._train.presets import preset_target
from rlstruct.algos._train.result import TrainResult
from rlstruct.algos._train.run_folder import write_whole
from rlstruct.devices import cpu_state_dict

__all__ = ["explained_by_divergence", "finish_diverged", "finish_training"]

log = logging.getLogger(__name__)


def explained_by_divergence(run: Run) -> Callable[..., bool]:
    """The exit function that suppresses an exception of a run found diverged, recording it beside what diverged."""

    def exit_(kind: type[BaseException] | None, error: BaseException | None, traceback: Any) -> bool:
        if not isinstance(error, Exception) or run.diverged is None:
            return False
        run.diverged["error"] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
        return True

    return exit_


def finish_diverged(run: Run, *, title: str) -> TrainResult:
    """The end of a run that diverged (``run.diverged``): no final evaluation (``eval_return`` nan,
    ``reached_target`` False) and no checkpoint of its weights; the checkpoint in its log folder, written before the
    divergence (``checkpoint_every``, or the one it resumed), is kept and named. The learning curve and
    ``summary.json`` (``stop_reason`` ``"diverged"`` and what diverged) are written as for any run.
    """
    found = run.diverged
    assert found is not None, "finish_diverged ends a run that diverged"
    run.close()
    kept = run.logdir / CHECKPOINT_NAME
    checkpoint = str(kept) if run.logger and kept.is_file() else None
    wall = run.elapsed()
    result = TrainResult(math.nan, run.env_steps, wall, run.history, str(run.logdir), run.iteration,
                         checkpoint=checkpoint, target_return=run.target_return, interrupted=run.interrupted,
                         stop_signal=run.stop_signal, preset=run.config.preset, startup_s=run.startup_s,
                         world_size=run.world_size, stop_reason="diverged",
                         preset_target=preset_target(run.config.preset), diverged=found,
                         run_wall_time_s=run.wall_offset + wall, compile=run.compile_meter.read())
    if not run.logger:
        return result
    error = f"; then {found['error']}" if "error" in found else ""
    log.warning("the run diverged: %s was %s at iteration %d (found at iteration %d, %d env steps%s): no final "
                "evaluation, no checkpoint of its weights (kept: %s); lower --lr or clip the gradients, and train "
                "again", found["quantity"], found["value"], found["iteration"], run.iteration, run.env_steps, error,
                checkpoint or "none")
    result.plot = plot_learning_curve(run.history, run.logdir / "learning_curve.png",
                                      f"{title} on {run.config.env} ({run.config.backend}), seed {run.config.seed}, "
                                      "diverged")
    write_whole(run.logdir / Run.SUMMARY_NAME, json.dumps(result.summary(), indent=2))
    run.report(result.summary(), [result.plot])
    return result


def _decide_the_evaluations_due(run: Run, evaluator: Evaluator) -> None:
    """Runs the evaluations still under way or queued, in order, each recorded under the stopping rule as during
    training (a candidate's confirmation runs next), until one confirms the target. With evaluation workers these
    are the ones whose results had not come back when training stopped; in process, the last one launched: the
    same evaluations decide in both modes, whatever the workers' speed."""
    while not run.reached_target and (evaluator.pending or evaluator.queued):
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

    A run stopped at its target (a confirmation cleared it: see :meth:`~.log.Run.record_eval`) keeps the weights
    that were confirmed (not those of the iterations since) and reports the confirmation's return: no further
    evaluation runs that could disagree. Otherwise the evaluations due are run (the queue of
    :class:`~.evaluation.Evaluator`) under the same stopping rule (a candidate among them gets its confirmation,
    which may stop the run at its target as above), and the final weights are evaluated again on fresh episodes,
    whose return is reported. An interrupted run (``run.interrupted``), or one whose batcher worker failed with no
    restart left (``run.worker_failure``: ``stop_reason`` ``"worker_failed"``), skips those: it keeps an evaluation
    that has already finished, if any (none after a worker's failure), and its result's ``eval_return`` is the
    last evaluation's (nan if none). In every case ``reached_target`` is ``eval_return >= target_return``, and
    ``eval_env_steps`` says at which env steps the weights reported on were taken.
    A run found diverged (``run.diverged``: checked first, with the rows since the last check and the weights) ends
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
    if run.diverged is not None:
        if run.worker_failure is not None:  # what the diverged weights made a worker do, as for an error raised
            run.diverged.setdefault("error", f"BatcherWorkerError: {run.worker_failure['error']}")
        return finish_diverged(run, title=title)
    config, world_size = run.config, run.world_size
    interrupted, failure = run.interrupted, run.worker_failure
    # A rank whose own check did not say stop was stopped by another's vote.
    stop_reason = ("worker_failed" if failure is not None else "signal" if interrupted
                   else run.stop_reason or "another_rank")
    # A signal or a worker's failure stops the run where it is: no evaluation runs after it.
    halted = interrupted or failure is not None
    if not run.logger:
        run.close()
        wall = run.elapsed()
        return TrainResult(math.nan, run.env_steps, wall, run.history, str(run.logdir), run.iteration,
                           interrupted=interrupted, stop_signal=run.stop_signal, world_size=world_size,
                           stop_reason=stop_reason, run_wall_time_s=run.wall_offset + wall, worker_failure=failure)
    if run.iteration == 0 and not halted:
        log.warning("no training iteration ran: the time limit (%g s) was spent before the first one (setup, "
                    "compilation, the first evaluation); what follows evaluates the untrained policy. Raise "
                    "--time-limit", config.time_limit)
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
            stop_reason = "target" if run.reached_target else stop_reason
        if stop_reason == "target":
            assert run.kept_weights is not None and run.last_eval is not None
            model.load_state_dict(run.kept_weights)
            eval_return, eval_env_steps = run.last_eval, run.kept_env_steps
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
    plot = plot_learning_curve(run.history, run.logdir / "learning_curve.png",
                               f"{title} on {config.env} ({config.backend}), seed {config.seed}{suffix}")
    result = TrainResult(eval_return, run.env_steps, wall, run.history, str(run.logdir), run.iteration,
                         checkpoint, plot, run.target_return, run.reached_target, interrupted, run.stop_signal,
                         config.preset, run.startup_s, run.time_to_target_s, world_size, stop_reason,
                         preset_target(config.preset), eval_env_steps=eval_env_steps,
                         run_wall_time_s=run.wall_offset + wall, worker_failure=failure,
                         compile=run.compile_meter.read())
    write_whole(run.logdir / Run.SUMMARY_NAME, json.dumps(result.summary(), indent=2))
    run.report(result.summary(), [checkpoint, plot, *(run.videos.paths if run.videos is not None else [])])
    return result
