"""What a family's training loop is: its type (:class:`TrainingLoop`, which an algorithm's description carries) and
the two pieces every loop calls besides the batchers and the ends: the run's frame for a checked setup
(:func:`open_run`) and the end of every iteration (:func:`record_iteration`). The batchers are
:func:`~.session.open_batchers`'s and :func:`~.session.open_evaluator`'s, the ends :mod:`~.finish`'s.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from rlstruct.algos._train.evaluation import Evaluator
from rlstruct.algos._train.log import Run
from rlstruct.algos._train.registry import algorithm_source
from rlstruct.algos._train.result import TrainResult
from rlstruct.algos._train.session import Setup, training_run
from rlstruct.algos._train.stop_rule import StopRule
from rlstruct.algos.returns import episode_statistics
from rlstruct.devices import cpu_state_dict
from rlstruct.errors import BatcherWorkerError
from rlstruct.structures import TemporalDictTensor

if TYPE_CHECKING:  # the profiler stays out of a training run's imports
    from rlstruct.batchers.profile import LoopTimer

log = logging.getLogger(__name__)

__all__ = ["TrainingEpisodes", "TrainingLoop", "open_run", "record_iteration", "until_a_worker_fails"]


class TrainingLoop(Protocol):
    """A family's training loop: trains ``setup.algorithm`` from a checked :class:`~.session.Setup` and returns the
    final evaluation and the run's history. ``rlstruct train``, ``sweep`` and ``profile`` call the loop an
    algorithm's description carries (:attr:`~.registry.Algorithm.loop`), whatever its family.

    With ``timer`` (``rlstruct profile``'s :class:`~rlstruct.batchers.profile.LoopTimer`), every iteration starts
    with phase ``collect`` and times its learner's phases under the names of
    :data:`~rlstruct.batchers.profile.LEARNER_PHASES` that fit; it hands the timer its training batcher
    (``timer.watch``) and opens it with ``sync_timings=timer.sync``. Without, nothing is timed and nothing waits for a
    device.
    """

    def __call__(self, setup: Setup, *, timer: LoopTimer | None = None) -> TrainResult:
        ...


def open_run(setup: Setup) -> contextlib.AbstractContextManager[tuple[Run, contextlib.ExitStack]]:
    """The frame of ``setup``'s training run: :func:`~.session.training_run` of its algorithm, config and env, its
    resumed checkpoint, its rank and its evaluation listeners, the algorithm's source recorded. It yields ``(run,
    stack)``: what the loop opens goes on ``stack``, closed in reverse order when the frame exits.

    A loop returns :func:`~.finish.finish_training` from inside the frame; an error of the loop that the run's
    divergence explains is suppressed as the frame exits, and the loop then returns
    :func:`~.finish.finish_diverged` after it.
    """
    world = setup.world
    return training_run(setup.algorithm.name, setup.config, setup.spec, start=setup.start, resume=setup.resume,
                        logger=world.is_logger, world_size=world.size, on_evaluation=setup.on_evaluation,
                        source=algorithm_source(setup.algorithm))


def record_iteration(run: Run, evaluator: Evaluator, env_steps: int, stats: dict[str, Any], *, model: nn.Module,
                     learner: Callable[[], dict[str, Any]] = dict,
                     weights: Callable[[], dict[str, torch.Tensor]] | None = None) -> None:
    """The end of every training iteration: its row (``env_steps`` new env steps of every rank, ``stats``: 0-d
    tensors or floats, converted every ``log_every`` iterations), then, in the process that writes the run's files,
    the evaluation's turn (``config.eval_every``) and the checkpoint's (``config.checkpoint_every``).

    Args:
        run: the run (:func:`open_run`'s).
        evaluator: the run's evaluator.
        env_steps: the env steps this iteration took, over every rank: the budget is global.
        stats: the iteration's statistics.
        model: the network the checkpoint's ``model`` holds (what ``rlstruct eval`` runs).
        learner: returns what the checkpoint keeps besides ``model`` (a
            :meth:`~.learner_state.LearnerState.state_dict`): called only when a checkpoint is written.
        weights: returns the weights an evaluation runs, called only when one is due (default: a CPU copy of
            ``model``'s).
    """
    run.record(env_steps, stats)
    if run.logger:
        run.poll_evaluation(evaluator, weights or functools.partial(cpu_state_dict, model))
        run.poll_checkpoint(model, learner)


class TrainingEpisodes:
    """The mean return and length of the training episodes that end in each collection of auto-reset envs, whose
    partial sums carry over from one collection to the next: ``n_rows`` the training batcher's envs, the sums on
    ``device``."""

    def __init__(self, n_rows: int, device: torch.device):
        self.returns = torch.zeros(n_rows, device=device)
        self.lengths = torch.zeros(n_rows, dtype=torch.int64, device=device)

    def add(self, tt: TemporalDictTensor, stats: dict[str, Any]) -> None:
        """Adds a collection; its ``train/episode_return`` and ``train/episode_length`` go into ``stats`` (nan: no
        episode ended in it)."""
        ret_sum, len_sum, count, self.returns, self.lengths = episode_statistics(
            tt["_observation/reward"], tt["_observation/done"], self.returns, self.lengths)
        stats["train/episode_return"] = ret_sum / count
        stats["train/episode_length"] = len_sum / count


@contextlib.contextmanager
def until_a_worker_fails(*rules: StopRule) -> Iterator[None]:
    """Runs the block; a batcher worker that fails in it with no restart left (a :class:`BatcherWorkerError`: it
    raised, died or hung) ends the block and stops the run (each run of ``rules``: a population's) at its next check
    (:meth:`~.stop_rule.StopRule.worker_failed`, stop reason ``"worker_failed"``). The learner in this process is
    intact, so the run ends as for a signal, with its checkpoint and summary, which keeps the traceback the worker
    sent (``None`` for one that died); this process's goes to the debug log.

    Around an iteration's collection it leaves the iteration unrecorded (the checkpoint is the previous one's
    state); around the weights' push after an update, the iteration goes on to its record, so that the checkpoint's
    counters count the update its weights hold."""
    try:
        yield
    except BatcherWorkerError as e:
        for rule in rules:
            rule.worker_failed(e)
        log.debug("batcher worker %d failed with no restart left; stopping the run", e.worker_id, exc_info=True)
