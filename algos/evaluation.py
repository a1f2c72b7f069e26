"""Asynchronous evaluation of a training run's weights with an episodic batcher."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from rlstruct.algos.returns import episode_returns
from rlstruct.batchers import RL_Batcher
from rlstruct.errors import RLStructError
from rlstruct.structures import DictTensor, Trajectories

__all__ = ["Evaluator"]

log = logging.getLogger(__name__)


class Evaluator:
    """Asynchronous evaluation with an episodic batcher (rlstructures' pattern §5.9(d)).

    :meth:`poll` never blocks: it collects a finished evaluation when there is one
    (``get(blocking=False)``) and then, at most every ``every`` iterations, sends the current weights
    (``update``), restarts the episodes (``reset``) and launches the next evaluation (``execute``).
    With worker processes the evaluation runs while training goes on; in process (``n_processes=0``),
    ``execute`` runs the episodes before it returns. :meth:`final` evaluates the final weights, blocking.

    Args:
        batcher: an episodic batcher whose ``n_timesteps`` covers a whole episode.
        agent_info: the evaluation's agent_info (CPU, one row per env), e.g. ``stochastic=False``.
        every: iterations at least between two launches.
    """

    def __init__(self, batcher: RL_Batcher, agent_info: DictTensor, every: int):
        self.batcher = batcher
        self.agent_info = agent_info
        self.every = every
        self.pending = False
        self.last_launch: int | None = None
        self._launch_steps = 0
        self._launch_weights: dict[str, torch.Tensor] | None = None
        #: the weights of the last evaluation collected (what its result is about)
        self.evaluated_weights: dict[str, torch.Tensor] | None = None

    def launch(self, weights: dict[str, torch.Tensor], iteration: int, env_steps: int) -> None:
        """Sends ``weights`` and starts an evaluation of ``batcher.n_elems()`` episodes."""
        self.batcher.update(weights)
        self.batcher.reset(agent_info=self.agent_info)
        self.batcher.execute()
        self.pending = True
        self.last_launch = iteration
        self._launch_steps = env_steps
        self._launch_weights = weights

    def poll(
        self, weights: Callable[[], dict[str, torch.Tensor]], iteration: int, env_steps: int
    ) -> dict[str, float] | None:
        """Collects a finished evaluation (or ``None``) and launches the next one when it is time.

        Args:
            weights: called only when a launch happens (so that the CPU copy is made only then).
            iteration: the current training iteration.
            env_steps: the current training env steps.
        """
        result = None
        if self.pending:
            traj, n = self.batcher.get(blocking=False)
            if traj is None:
                return None
            self.pending = False
            result = self._summarise(traj, n)
        if self.last_launch is None or iteration - self.last_launch >= self.every:
            self.launch(weights(), iteration, env_steps)
        return result

    def collect(self) -> dict[str, float] | None:
        """The result of a pending evaluation if it has finished (never waits, launches nothing), else ``None``."""
        if not self.pending:
            return None
        traj, n = self.batcher.get(blocking=False)
        if traj is None:
            return None
        self.pending = False
        return self._summarise(traj, n)

    def final(self, weights: dict[str, torch.Tensor], iteration: int, env_steps: int) -> tuple[dict | None, dict]:
        """Waits for a pending evaluation, then evaluates ``weights`` again (blocking, fresh episodes).

        Returns:
            ``(the pending evaluation's result or None, the final result)``.
        """
        previous = None
        if self.pending:
            traj, n = self.batcher.get()
            self.pending = False
            previous = self._summarise(traj, n)
        self.launch(weights, iteration, env_steps)
        traj, n = self.batcher.get()
        self.pending = False
        return previous, self._summarise(traj, n)

    def _summarise(self, traj: Trajectories, n_running: int) -> dict[str, float]:
        self.evaluated_weights = self._launch_weights
        if n_running:
            log.warning("%d evaluation episodes did not finish within %d steps; their returns are partial",
                        n_running, self.batcher.n_timesteps)
        returns, lengths = episode_returns(traj)
        return {
            "eval/return": float(returns.mean()),
            "eval/return_min": float(returns.min()),
            "eval/return_max": float(returns.max()),
            "eval/length": float(lengths.float().mean()),
            "eval/episodes": float(returns.shape[0]),
            "eval/launch_env_steps": float(self._launch_steps),
        }

    def close(self) -> None:
        """Collects a pending evaluation (a worker must not be closed mid-acquisition) and closes the batcher."""
        try:
            if self.pending:
                self.batcher.get()
        except RLStructError as e:  # a failed batcher has nothing to collect; the original error is what matters
            log.debug("evaluation batcher: %s", e)
        finally:
            self.pending = False
            self.batcher.close()
