"""How a run that diverged ends: an error its divergence explains is suppressed (:func:`explained_by_divergence`), and
the run ends without a final evaluation or a checkpoint of its weights (:func:`finish_diverged`). What finds the
divergence is :class:`~.finite.DivergenceGuard`.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Any

from rlstruct.algos._train.checkpoints import CHECKPOINT_NAME, plot_learning_curve
from rlstruct.algos._train.log import Run
from rlstruct.algos._train.presets import preset_target
from rlstruct.algos._train.result import TrainResult

__all__ = ["explained_by_divergence", "finish_diverged"]

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
    result = TrainResult(math.nan, run.env_steps, run.elapsed(), run.history, str(run.logdir), run.iteration,
                         checkpoint=checkpoint, target_return=run.target_return, interrupted=run.interrupted,
                         stop_signal=run.stop_signal, preset=run.config.preset, startup_s=run.startup_s,
                         world_size=run.world_size, stop_reason="diverged",
                         preset_target=preset_target(run.config.preset), diverged=found)
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
    with open(run.logdir / Run.SUMMARY_NAME, "w") as f:
        json.dump(result.summary(), f, indent=2)
    run.report(result.summary(), [result.plot])
    return result
