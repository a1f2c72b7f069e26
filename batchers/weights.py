"""How a learner's weights reach its training batcher's agent: shared, copied on the device, or sent as a CPU copy.

Every algorithm used to send ``cpu_state_dict(model)`` after each update: on a GPU learner that is a
device-to-host copy and a synchronisation per iteration, followed by a host-to-device copy into the agent.
When the batcher steps in this process (``n_processes=0``) on the learner's own device, none of that is
needed: :class:`WeightSync` either lets the agent use the learner's tensors themselves (``"shared"``), or
copies them into the agent's in place on the device (``"copy"``), with no host round trip.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from rlstruct.batchers.batcher import RL_Batcher
from rlstruct.devices import DeviceLike, as_device, cpu_state_dict, tree_copy
from rlstruct.errors import ConfigError

__all__ = ["WeightSync", "SYNC_MODES"]

log = logging.getLogger(__name__)

#: the ways :class:`WeightSync` moves weights, and ``"auto"``
SYNC_MODES = ("auto", "shared", "copy", "cpu")


class WeightSync:
    """Keeps a training batcher's agent on the learner's weights, with the cheapest transfer the placement allows.

    Modes:

    * ``"shared"``: the in-process agent's ``model`` (an ``nn.Module`` with the learner's state-dict keys and
      shapes) is rebound onto the learner's parameters and buffers (``load_state_dict(assign=True)``); the
      optimizer updates them in place, so :meth:`push` does nothing. The acquisition must then run after the
      optimizer step: on the CPU the loop is sequential, on CUDA both run on the same stream (an acquisition on
      another stream must wait for the learner's with an event, see :class:`~rlstruct.batchers.pipeline.Pipeline`).
    * ``"copy"``: the agent keeps its own tensors and :meth:`push` copies the learner's into them in place on the
      device (one ``_foreach_copy_``, no host round trip): for an acquisition that runs while the learner updates
      (overlap), which must see a snapshot. An agent without such a ``model`` gets ``agent.update`` with a device
      copy of the state dict instead.
    * ``"cpu"``: :meth:`push` sends ``batcher.update(cpu state dict)``, what worker processes need.
    * ``"auto"``: ``"shared"`` where the batcher is in process on the learner's device and its agent exposes a
      matching ``model``, ``"copy"`` where only the placement matches (or where ``snapshot``), else ``"cpu"``.
      This is the one place the "batcher in process on the learner's device" decision is made: a training
      run asks for ``"auto"`` (or ``"cpu"``) and reads the outcome from :attr:`mode`.

    The evaluator is not this class's concern: evaluations are rare and keep taking CPU copies.

    Args:
        batcher: the training batcher (its weights are set by the first :meth:`push`).
        model: the learner's model.
        learner_device: where ``model`` lives.
        mode: one of :data:`SYNC_MODES`.
        snapshot: with ``"auto"``, copy rather than share where the placement matches: an acquisition that runs
            while the learner updates (overlap) must see a snapshot of the weights.

    Raises:
        ConfigError: ``"shared"`` or ``"copy"`` asked for with worker processes or another device (or, for
            ``"shared"``, an agent without a matching ``model``).

    >>> from rlstruct.algos.networks import create_policy_agent, build_actor_critic
    >>> from rlstruct.algos import create_env, describe_env
    >>> spec = describe_env("CartPole-v1", "torch", None)
    >>> model = build_actor_critic(spec, (8,))
    >>> with RL_Batcher(4, create_policy_agent, {"spec": spec, "hidden_sizes": (8,)}, create_env,
    ...                 {"name": "CartPole-v1", "n_envs": 2, "autoreset": True}, 0, [0]) as batcher:
    ...     sync = WeightSync(batcher, model, "cpu")
    ...     shared = next(batcher.local_agent().model.parameters()).data_ptr() == next(model.parameters()).data_ptr()
    >>> sync.mode, shared
    ('shared', True)
    """

    def __init__(self, batcher: RL_Batcher, model: nn.Module, learner_device: DeviceLike, mode: str = "auto", *,
                 snapshot: bool = False):
        if mode not in SYNC_MODES:
            raise ValueError(f"mode must be one of {list(SYNC_MODES)}, got {mode!r}")
        self.batcher = batcher
        self.model = model
        self.learner_device = as_device(learner_device)
        # An RL_Batcher without worker processes runs its agent here; a RayBatcher's agents are in its actors.
        in_process = isinstance(batcher, RL_Batcher) and batcher.n_processes == 0
        same_place = in_process and batcher.device == self.learner_device
        if mode in ("shared", "copy") and not same_place:
            raise ConfigError(
                f"weight sync mode={mode!r} needs an in-process batcher (n_processes=0) on the learner's device "
                f"{self.learner_device}, got n_processes={batcher.n_processes} on {batcher.device}; use mode='cpu' "
                "(or 'auto'), or put the batcher on the learner's device with n_processes=0"
            )
        self._agent: Any = batcher.local_agent() if same_place else None
        target = self._agent_module()
        if mode == "shared" and target is None:
            raise ConfigError(
                f"weight sync mode='shared' needs an agent with a `model` nn.Module holding the learner's state-dict "
                f"keys and shapes, got {type(self._agent).__name__}; use mode='copy' (or 'auto')"
            )
        if mode == "auto":
            mode = "cpu" if not same_place else ("shared" if target is not None and not snapshot else "copy")
        self.mode = mode
        self._src: list[torch.Tensor] = []
        self._dst: list[torch.Tensor] = []
        if mode == "shared":
            # The agent's module now holds the learner's tensors (as non-trainable Parameters over the same storage).
            target.load_state_dict(model.state_dict(), assign=True)
        elif mode == "copy" and target is not None:
            self._src = list(model.state_dict().values())
            self._dst = list(target.state_dict().values())
        log.debug("weight sync: %s", mode)

    def _agent_module(self) -> nn.Module | None:
        """The agent's ``model`` when it matches the learner's state dict key for key, shape for shape."""
        target = getattr(self._agent, "model", None) if self._agent is not None else None
        if not isinstance(target, nn.Module):
            return None
        mine, theirs = self.model.state_dict(), target.state_dict()
        if mine.keys() != theirs.keys():
            return None
        if any(mine[k].shape != theirs[k].shape or mine[k].dtype != theirs[k].dtype
               or mine[k].device != theirs[k].device for k in mine):
            return None
        return target

    @property
    def copies_to_host(self) -> bool:
        """Whether :meth:`push` goes through the host (``"cpu"`` mode)."""
        return self.mode == "cpu"

    def push(self) -> None:
        """Gives the batcher's agent the learner's current weights (nothing to do when shared).

        In ``"copy"`` mode the copy is queued on the current stream: run it where the acquisition that reads the
        agent's weights is ordered after it, and the learner's next write of its weights after it.
        """
        if self.mode == "shared":
            return
        if self.mode == "cpu":
            self.batcher.update(cpu_state_dict(self.model))
            return
        with torch.no_grad():
            if self._dst:
                torch._foreach_copy_(self._dst, self._src)
            else:
                self._agent.update(tree_copy(self.model.state_dict(), self.batcher.device))
