"""When a run stops, and why (:class:`StopRule`): its env-step budget, its time limit, its target (an evaluation that
reaches it, confirmed on fresh episodes), a signal, a divergence, a batcher worker's failure; and the target itself
(:func:`run_target`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from rlstruct.algos._env_spec import EnvSpec
from rlstruct.algos._train.config import RunConfig
from rlstruct.algos._train.finite import DivergenceGuard
from rlstruct.algos._train.presets import preset_stop_target
from rlstruct.algos._train.result import reaches
from rlstruct.errors import BatcherWorkerError

if TYPE_CHECKING:
    from rlstruct.algos._train.evaluation import Evaluator

__all__ = ["StopRule", "run_target"]


def run_target(config: RunConfig, spec: EnvSpec) -> float | None:
    """The return at which a run stops: ``config.target_return`` when set; else, with ``stop_at_reward_threshold``
    (the default), the target of the run's preset on this env (:func:`~.presets.preset_stop_target`), else the env's
    ``reward_threshold``; else ``None`` (the run spends its budget).

    >>> spec = EnvSpec((4,), "float32", 2, 500, reward_threshold=475.0)
    >>> run_target(RunConfig(target_return=100.0), spec), run_target(RunConfig(), spec)
    (100.0, 475.0)
    >>> run_target(RunConfig(stop_at_reward_threshold=False), spec) is None
    True
    """
    if config.target_return is not None:
        return config.target_return
    if not config.stop_at_reward_threshold:
        return None
    preset = preset_stop_target(config.preset, config.env)
    return preset if preset is not None else spec.reward_threshold


class StopRule:
    """When a run stops, and why: asked before every iteration (:meth:`should_stop`), told of what stops a run from
    outside that check (a signal: :attr:`signal`; a batcher worker's failure: :meth:`worker_failed`; a non-finite
    statistic or weight: :attr:`guard`), and judging each evaluation of trained weights against the target
    (:meth:`judge`).

    The reasons, in the order they are checked (:data:`~.result.STOP_REASONS`): ``"diverged"``, ``"worker_failed"``,
    ``"signal"``, ``"target"`` (a confirmation cleared the target), ``"budget"`` (``config.max_env_steps`` spent),
    ``"time_limit"`` (``config.time_limit`` seconds of ``clock`` spent, when it is not ``None``).

    Args:
        config: the run's config (its budget, time limit and target settings).
        spec: the env's description (its reward threshold).
        clock: the seconds the run has spent in this process.

    Attributes:
        target_return: the return at which the run stops (:func:`run_target`), or ``None``.
        guard: finds a non-finite loss, gradient norm or weight in what the run converts (:attr:`diverged`).
        signal: the signal (``"SIGINT"``: a Ctrl-C, or ``"SIGTERM"``) that interrupted the run, else ``None``: the
            loop stops at its next check.
        worker_failure: the batcher worker's failure that stopped the run (``{"worker_id", "error", "traceback"}``),
            else ``None``.
        reached_target: whether a confirmation cleared the target.
        kept_weights: the weights whose confirmation cleared the target, which the run keeps (``None`` before).
        kept_env_steps: the env steps at which those weights were taken (``None`` before).
        time_to_target_s: ``clock()`` when that confirmation was judged (``None`` before).
        reason: why :meth:`should_stop` last said to stop, else ``None``.

    >>> rule = StopRule(RunConfig(max_env_steps=100), EnvSpec((4,), "float32", 2, 500, 475.0), clock=lambda: 0.0)
    >>> rule.should_stop(99), rule.should_stop(100), rule.reason
    (False, True, 'budget')
    """

    def __init__(self, config: RunConfig, spec: EnvSpec, *, clock: Callable[[], float]):
        self.max_env_steps = config.max_env_steps
        self.time_limit = config.time_limit
        self.target_return = run_target(config, spec)
        self.clock = clock
        self.guard = DivergenceGuard()
        self.signal: str | None = None
        self.worker_failure: dict[str, Any] | None = None
        self.reached_target = False
        self.kept_weights: dict[str, torch.Tensor] | None = None
        self.kept_env_steps: int | None = None
        self.time_to_target_s: float | None = None
        self.reason: str | None = None

    @property
    def diverged(self) -> dict[str, Any] | None:
        """The first non-finite training statistic or weight found (``{"quantity", "iteration", "value"}``), else
        ``None``: checked at every conversion of the run's rows, so at most ``log_every`` iterations after it
        happened."""
        return self.guard.found

    @property
    def interrupted(self) -> bool:
        """Whether a signal interrupted the run (see :attr:`signal`)."""
        return self.signal is not None

    def should_stop(self, env_steps: int) -> bool:
        """True once the run diverged, lost a worker or was interrupted, a confirmation cleared the target, or the
        env-step budget (at ``env_steps``) or the time limit is spent; :attr:`reason` says which."""
        if self.diverged is not None:
            self.reason = "diverged"
        elif self.worker_failure is not None:
            self.reason = "worker_failed"
        elif self.interrupted:
            self.reason = "signal"
        elif self.reached_target:
            self.reason = "target"
        elif self.max_env_steps is not None and env_steps >= self.max_env_steps:
            self.reason = "budget"
        elif self.time_limit is not None and self.clock() >= self.time_limit:
            self.reason = "time_limit"
        else:
            self.reason = None
        return self.reason is not None

    def worker_failed(self, error: BatcherWorkerError) -> None:
        """Records a batcher worker's failure with no restart left (the first one: those after it follow from it) as
        :attr:`worker_failure`: its worker, the error's first line and the traceback the worker sent (``None`` for
        one that died)."""
        if self.worker_failure is None:
            self.worker_failure = {"worker_id": error.worker_id,
                                   "error": (str(error).splitlines() or [type(error).__name__])[0],
                                   "traceback": error.remote_traceback}

    def judge(self, row: Mapping[str, float], launched: int, evaluator: Evaluator, iteration: int) -> None:
        """Applies the target to an evaluation that ``evaluator`` gave during training (``row``, of weights taken at
        ``launched`` env steps, recorded at ``iteration``).

        An evaluation whose mean reaches the target is a candidate: ``evaluator`` evaluates the same weights again on
        fresh episodes next (:meth:`~.evaluation.Evaluator.confirm`). A confirmation whose mean reaches it stops the
        run, which keeps those weights (:attr:`reached_target`, :attr:`kept_weights`); one below lets it go on. The
        untrained network's evaluation does not count (on CartPole a random network can balance by luck), nor does
        one of a run that diverged.
        """
        if launched <= 0 or self.diverged is not None or not reaches(row["eval/return"], self.target_return):
            return
        assert evaluator.evaluated_weights is not None
        if row.get("eval/confirmation"):
            self.reached_target = True
            self.kept_weights, self.kept_env_steps = evaluator.evaluated_weights, launched
            if self.time_to_target_s is None:
                self.time_to_target_s = self.clock()
        else:
            evaluator.confirm(evaluator.evaluated_weights, iteration, launched)
