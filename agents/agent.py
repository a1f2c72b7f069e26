"""The agent API: RL_Agent, and replaying an agent over collected trajectories."""

from __future__ import annotations

from typing import Any

import torch

from rlstruct.seeding import env_seeds
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories

__all__ = ["RL_Agent", "replay_agent", "replay_agent_stateless"]


class RL_Agent:
    """A policy that a batcher steps over B running environments at a time.

    Subclasses implement :meth:`__call__` and, if they carry a recurrent state,
    :meth:`initial_state`. The batcher calls the agent under ``torch.no_grad()``;
    gradients are rebuilt later by :func:`replay_agent` through :meth:`call_replay`.

    The agent itself resets its state on rows where ``observation["initial_state"]``
    is true (for example with :func:`rlstruct.masked_dicttensor`): with auto-reset
    environments, episodes start in the middle of an acquisition.

    >>> class Greedy(RL_Agent):
    ...     def __call__(self, state, observation, agent_info, history=None):
    ...         return DictTensor({"action": observation["frame"].argmax(-1)}), state
    >>> action, _ = Greedy()(DictTensor({}), DictTensor({"frame": torch.eye(3)[[2, 0]]}), DictTensor({}))
    >>> action["action"]
    tensor([2, 0])
    """

    def initial_state(self, agent_info: DictTensor, B: int) -> DictTensor:
        """The state of ``B`` fresh episodes (``[B, ...]`` on the agent's device); empty when stateless.

        Args:
            agent_info: CPU DictTensor, empty or of ``B`` rows.
            B: the number of rows.
        """
        return DictTensor({})

    def __call__(
        self,
        state: DictTensor,
        observation: DictTensor,
        agent_info: DictTensor,
        history: TemporalDictTensor | None = None,
    ) -> tuple[DictTensor, DictTensor]:
        """One step for B running envs.

        Args:
            state: the agent state ``[B, ...]`` (empty when stateless).
            observation: the env observation ``[B, ...]`` (keys ``frame``, ``reward``, ``done``,
                ``initial_state``, ...). Read it, do not modify it: in a batcher its tensors may be views of the
                trajectory buffer (they are with envs that write in place, such as ``GymEnvInf`` over a list),
                overwritten by later acquisitions, so a state that keeps one must keep a copy (``clone()``).
            agent_info: CPU DictTensor ``[B, ...]`` or empty (e.g. ``stochastic``, ``epsilon``).
            history: with :meth:`require_history`, the steps of the current acquisition so far.

        Returns:
            ``(action, new_state)``: the agent output ``[B, ...]``, which holds at least the key ``action``
            and is stored whole under ``action/*``, and the next state (same keys and shapes as
            :meth:`initial_state`).
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement __call__(state, observation, agent_info, history)"
        )

    def update(self, state_dict: Any) -> None:
        """Receives what :meth:`RL_Batcher.update` sends (usually a CPU ``state_dict``)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement update(state_dict) to receive weights from batcher.update"
        )

    def seed(self, seed: int) -> None:
        """Seeds the agent's own randomness (called once per worker with ``agent_seeds[k]``)."""

    def seed_envs(self, seed: int, env_index: int) -> None:
        """Seeds the agent for envs ``env_index, env_index + 1, ...`` of a batcher whose one agent seed is ``seed``
        (called once per worker, instead of :meth:`seed`, when the batcher is given one seed).

        An agent whose draws for env ``i`` at step ``t`` depend on ``(seed, i, t)`` only (the algorithms' agents)
        overrides it: its actions then do not depend on how the envs are split over processes. The default seeds
        the agent's own randomness with a seed drawn from ``(seed, env_index)``, distinct per worker.
        """
        self.seed(env_seeds(seed, 1, env_index)[0])

    def noise_state(self) -> torch.Tensor | None:
        """Where the agent's own randomness stands (a tensor of the same shape and dtype at every call), or ``None``
        when it has none of its own: it draws from torch's global generator, or nothing.

        A batcher with ``restart_workers`` keeps it at every acquisition's end and gives it to a failed worker's
        replacement's :meth:`set_noise_state`, so that the replacement draws what the failed agent would have. An
        agent that draws from a generator of its own overrides both; the default suits the others.
        """
        return None

    def set_noise_state(self, state: torch.Tensor) -> None:
        """Takes back a :meth:`noise_state` (a CPU copy): the agent then draws as the one it was read from."""

    def require_history(self) -> bool:
        """True when :meth:`__call__` needs the steps of the current acquisition so far."""
        return False

    def call_replay(
        self, trajectories: Trajectories, t: int, state: DictTensor | None
    ) -> tuple[DictTensor, DictTensor]:
        """Recomputes step ``t`` of every trajectory with gradients (used by :func:`replay_agent`).

        The default feeds ``observation/*`` at ``t`` to :meth:`__call__`, starting from
        ``info["agent_state/*"]`` at ``t == 0``. Override it to compute more (a critic, targets).

        Args:
            trajectories: on the agent's device.
            t: the time step.
            state: ``None`` at ``t == 0``, else the state returned for ``t - 1``.
        """
        if state is None:
            if t != 0:
                raise ValueError(f"call_replay needs the state of step t-1 when t > 0 (t={t}, state=None)")
            state = trajectories.info.truncate_key("agent_state/")
        agent_info = trajectories.info.truncate_key("agent_info/").to("cpu")
        observation = trajectories.trajectories.temporal_index(t).truncate_key("observation/")
        return self(state, observation, agent_info, None)

    def close(self) -> None:
        """Releases the agent's resources (called in the worker when the batcher closes)."""


def replay_agent(
    agent: RL_Agent, trajectories: Trajectories, replay_method_name: str = "call_replay"
) -> TemporalDictTensor:
    """Replays ``agent`` step by step over ``trajectories``, with gradients.

    Batched over the B trajectories: the only Python loop is over the T steps.
    Padding steps (``t >= lengths[b]``) are computed from padding inputs: mask them.

    Args:
        agent: the agent whose ``replay_method_name`` method has the signature of :meth:`RL_Agent.call_replay`.
        trajectories: ``B`` trajectories of ``T`` steps, on the agent's device.
        replay_method_name: the method to call at every step.

    Returns:
        ``TemporalDictTensor [B, T, ...]`` of the method's outputs, with the trajectories' lengths.

    Raises:
        ValueError: the trajectories have no step (``T == 0``), so the outputs' keys are unknown.

    >>> class Counter(RL_Agent):
    ...     def __call__(self, state, observation, agent_info, history=None):
    ...         return DictTensor({"action": observation["x"] + state["n"]}), DictTensor({"n": state["n"] + 1})
    >>> steps = TemporalDictTensor({"observation/x": torch.zeros(2, 3)}, torch.tensor([3, 1]))
    >>> info = DictTensor({"agent_state/n": torch.zeros(2)})
    >>> out = replay_agent(Counter(), Trajectories(info, steps))
    >>> out["action"], out.lengths
    (tensor([[0., 1., 2.],
            [0., 1., 2.]]), tensor([3, 1]))
    """
    method = getattr(agent, replay_method_name)
    T = trajectories.trajectories.temporal_size()
    if T == 0:
        raise ValueError(
            "replay_agent: the trajectories have no step to replay (T=0); skip empty batches before replaying"
        )
    state = None
    outputs: list[DictTensor] = []
    for t in range(T):
        out, state = method(trajectories, t, state)
        outputs.append(out)
    keys = outputs[0].keys()
    variables = {k: torch.stack([o[k] for o in outputs], dim=1) for k in keys}
    return TemporalDictTensor(variables, trajectories.trajectories.lengths.clone())


def replay_agent_stateless(agent: RL_Agent, trajectories: Trajectories, replay_method_name: str) -> TemporalDictTensor:
    """Calls ``agent.<replay_method_name>(trajectories)`` once for all steps (e.g. an MLP or a transformer over T).

    Returns:
        Whatever the method returns, normally a ``TemporalDictTensor [B, T, ...]``.
    """
    return getattr(agent, replay_method_name)(trajectories)
