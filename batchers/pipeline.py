"""The training batcher's acquisitions as a learner consumes them: one after the other, or overlapped with
learning (acquisition ``k + 1`` runs while the learner trains on batch ``k``).
"""

from __future__ import annotations

import logging
from typing import Any

from rlstruct._accel import accelerator_for
from rlstruct.batchers.batcher import RL_Batcher
from rlstruct.batchers.weights import WeightSync
from rlstruct.errors import BatcherStateError, ConfigError, RLStructError
from rlstruct.structures import DictTensor, Trajectories

__all__ = ["Pipeline"]

log = logging.getLogger(__name__)


class Pipeline:
    """Feeds a learner from an auto-reset training batcher, keeping the batcher's agent on the learner's weights.

    The loop is ``start()``, then per iteration ``traj = next()``, the update, ``updated()``; ``close()`` at the
    end collects an acquisition still pending. Sequential (``overlap=False``): ``next`` runs an acquisition with
    the current weights and returns it. Overlapped: ``next`` returns the acquisition launched by the previous
    ``next`` and launches the following one with the current weights (those of the update before).

    With ``overlap`` in process, the weights must be copied rather than shared (the learner writes its weights
    while the acquisition reads them): pass a :class:`WeightSync` in ``"copy"`` or ``"cpu"`` mode. A batcher built
    with ``zero_copy=True`` saves the copy out of its buffer: ``next``'s trajectories are then views of one of its
    two buffers, valid until the ``next`` after the following one.

    Args:
        batcher: an auto-reset training batcher, not reset yet.
        weights: how the learner's weights reach the batcher's agent.
        overlap: collect the next batch while the learner trains on this one.

    Raises:
        ConfigError: ``overlap`` in process with shared weights.

    >>> from rlstruct.algos.networks import build_actor_critic
    >>> from rlstruct.algos.policies import create_policy_agent
    >>> from rlstruct.algos import create_env, describe_env
    >>> spec = describe_env("CartPole-v1", "torch", None)
    >>> model = build_actor_critic(spec, (8,))
    >>> with RL_Batcher(4, create_policy_agent, {"spec": spec, "hidden_sizes": (8,)}, create_env,
    ...                 {"name": "CartPole-v1", "n_envs": 2, "autoreset": True}, 0, [0], zero_copy=True) as b:
    ...     pipe = Pipeline(b, WeightSync(b, model, "cpu", mode="copy"), overlap=True)
    ...     pipe.start(); first = pipe.next(); second = pipe.next(); pipe.close()
    >>> first.trajectories["observation/frame"].shape, first.trajectories.lengths.tolist()
    (torch.Size([2, 4, 4]), [4, 4])
    """

    def __init__(self, batcher: RL_Batcher, weights: WeightSync, *, overlap: bool = False):
        self.batcher = batcher
        self.weights = weights
        self.overlap = bool(overlap)
        self._in_process = batcher.n_processes == 0
        if self.overlap and self._in_process and weights.mode == "shared":
            raise ConfigError(
                "overlap=True needs the batcher's agent to hold a copy of the weights (the learner writes its "
                "own while the next acquisition reads them), got WeightSync mode='shared'; use mode='copy'"
            )
        accel = accelerator_for(batcher.device) if self._in_process and self.overlap else None
        self._accel = accel
        self._stream = accel.new_stream(batcher.device) if accel is not None else None
        self._pending = False
        self._started = False
        self._fresh = False

    @property
    def stream(self) -> Any:
        """The acquisitions' own stream (a ``torch.cuda.Stream`` with overlap in process on CUDA), else ``None``."""
        return self._stream

    def start(self) -> None:
        """Sends the initial weights and resets the envs (blocking)."""
        self.weights.push()
        self.batcher.reset()
        self._started = True
        self._fresh = True

    def _launch(self, agent_info: DictTensor | None) -> None:
        """Pushes the current weights and starts the next acquisition (on the side stream on CUDA) with ``agent_info``
        (``None``: the batcher's current one)."""
        # Sequential, start() and updated() have pushed the weights already; overlapped, the launch pushes them
        # (but the first, right after start()).
        push = self.overlap and not self._fresh
        self._fresh = False
        accel = self._accel
        if accel is None:
            if push:
                self.weights.push()
            self.batcher.execute(agent_info=agent_info)
        else:
            learner = accel.current_stream(self.batcher.device)
            # Everything the learner queued so far (its last update, its reads of the buffer this acquisition
            # overwrites) comes first on the device; the host does not wait.
            self._stream.wait_stream(learner)
            with accel.use_stream(self._stream):
                if push:
                    self.weights.push()
                copied = accel.new_event()
                copied.record(self._stream)
                self.batcher.execute(agent_info=agent_info)
            # The learner's next optimizer step must not write its weights before the copy has read them.
            learner.wait_event(copied)
        self._pending = True

    def next(self, agent_info: DictTensor | None = None) -> Trajectories:
        """The next batch, ``[B, T]`` on the batcher's device (with ``overlap``, one update stale).

        Args:
            agent_info: CPU, ``n_elems()`` rows: the ``agent_info`` of the acquisitions launched from now on (e.g. an
                exploration rate on a schedule); with ``overlap``, the batch returned was launched with the one before.
                ``None``: the batcher's current one.

        Raises:
            BatcherStateError: :meth:`start` was not called.
        """
        if not self._started:
            raise BatcherStateError("Pipeline.next needs start() first, got next() before start(); call start()")
        if not self._pending:
            self._launch(agent_info)
        if self._accel is not None:
            # The learner (and get's copy out of the buffer, if any) reads this batch only once the acquisition's
            # writes are done: an event, not a host sync.
            self._accel.current_stream(self.batcher.device).wait_stream(self._stream)
        traj, _ = self.batcher.get()
        self._pending = False
        if self.overlap:
            self._launch(agent_info)
        return traj

    def updated(self) -> None:
        """Marks the end of the learner's update: sequential, the batcher's agent gets the new weights now."""
        if not self.overlap:
            self.weights.push()
            self._fresh = True

    def close(self) -> None:
        """Collects the acquisition still pending (a batcher must not close mid-acquisition); idempotent. A batcher
        that failed has nothing to collect: its own ``close`` stops its workers."""
        if self._pending:
            self._pending = False
            try:
                self.batcher.get()
            except RLStructError as e:  # the failure that failed the batcher is what matters, reported already
                log.debug("pipeline: nothing to collect from a failed batcher: %s", e)
