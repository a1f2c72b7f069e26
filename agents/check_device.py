"""RL_Agent_CheckDevice: an agent wrapper that says which tensor is on the wrong device."""

from __future__ import annotations

from typing import Any

import torch

from rlstruct.agents.agent import RL_Agent
from rlstruct.devices import DeviceLike, as_device
from rlstruct.errors import DeviceMismatchError
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories

__all__ = ["RL_Agent_CheckDevice"]

_CPU = as_device("cpu")


def _check(method: str, argument: str, value: DictTensor | TemporalDictTensor | None, expected, fix: str) -> None:
    if value is None:
        return
    for k, v in value.items():
        if v.device != expected:
            raise DeviceMismatchError(
                f"{method}: {argument} must be on {expected}, got {v.device} (key {k!r}); {fix}"
            )
    if isinstance(value, TemporalDictTensor) and value.lengths.device != expected:
        raise DeviceMismatchError(
            f"{method}: {argument} must be on {expected}, got {value.lengths.device} (key 'lengths'); {fix}"
        )


class RL_Agent_CheckDevice(RL_Agent):
    """Wraps an agent and checks that every tensor it receives and returns is where it should be.

    ``state``, ``observation``, ``history``, the returned ``action`` and ``new_state``, the result of
    ``initial_state`` and the trajectories given to ``call_replay`` must be on ``device``;
    ``agent_info`` must be on the CPU. A violation raises :class:`DeviceMismatchError` naming the method,
    the argument, the first offending key, and the expected and actual devices. Every other method and
    attribute is forwarded to the wrapped agent, unchanged.

    Args:
        agent: the agent to check.
        device: where the agent's inputs and outputs must live.

    >>> import torch
    >>> class Const(RL_Agent):
    ...     def __call__(self, state, observation, agent_info, history=None):
    ...         return DictTensor({"action": torch.zeros(observation.n_elems(), dtype=torch.long)}), state
    >>> agent = RL_Agent_CheckDevice(Const(), "cpu")
    >>> agent(DictTensor({}), DictTensor({"frame": torch.zeros(2, 4)}), DictTensor({}))[0]["action"]
    tensor([0, 0])
    """

    def __init__(self, agent: RL_Agent, device: DeviceLike):
        self.agent = agent
        self.device = as_device(device)

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found on the wrapper: forward them.
        if name in ("agent", "device"):
            raise AttributeError(name)
        return getattr(self.agent, name)

    def _fix(self) -> str:
        return f"move it with .to({str(self.device)!r}) (or wrap the env in DeviceEnv)"

    def initial_state(self, agent_info: DictTensor, B: int) -> DictTensor:
        """The wrapped agent's initial state, after checking ``agent_info`` (CPU) and the state (agent device)."""
        _check("initial_state", "agent_info", agent_info, _CPU, "build agent_info on the CPU")
        state = self.agent.initial_state(agent_info, B)
        _check(
            "initial_state", "the returned state", state, self.device, "create the initial state on the agent's device"
        )
        return state

    def __call__(self, state, observation, agent_info, history=None):
        """The wrapped agent's step, after checking every input's device; then checks the outputs'."""
        _check("__call__", "state", state, self.device, self._fix())
        _check("__call__", "observation", observation, self.device, self._fix())
        _check("__call__", "agent_info", agent_info, _CPU, "build agent_info on the CPU")
        _check("__call__", "history", history, self.device, self._fix())
        action, new_state = self.agent(state, observation, agent_info, history)
        if action.empty():
            raise ValueError(
                "__call__: the returned action is empty; return a DictTensor with at least the key 'action'"
            )
        _check("__call__", "the returned action", action, self.device, "compute the action on the agent's device")
        _check("__call__", "the returned new_state", new_state, self.device, "compute the state on the agent's device")
        return action, new_state

    def call_replay(self, trajectories: Trajectories, t: int, state: DictTensor | None):
        """The wrapped agent's replay step, after checking that the trajectories and state are on the device."""
        _check("call_replay", "trajectories.info", trajectories.info, self.device, "call trajectories.to(device) first")
        _check("call_replay", "trajectories.trajectories", trajectories.trajectories, self.device,
               "call trajectories.to(device) first")
        _check("call_replay", "state", state, self.device, self._fix())
        return self.agent.call_replay(trajectories, t, state)

    def update(self, state_dict: Any) -> None:
        """Forwarded to the wrapped agent."""
        self.agent.update(state_dict)

    def seed(self, seed: int) -> None:
        """Forwarded to the wrapped agent (rlstructures' wrapper dropped it)."""
        self.agent.seed(seed)

    def seed_envs(self, seed: int, env_index: int) -> None:
        """Forwarded to the wrapped agent."""
        self.agent.seed_envs(seed, env_index)

    def noise_state(self) -> torch.Tensor | None:
        """Forwarded to the wrapped agent."""
        return self.agent.noise_state()

    def set_noise_state(self, state: torch.Tensor) -> None:
        """Forwarded to the wrapped agent."""
        self.agent.set_noise_state(state)

    def require_history(self) -> bool:
        """Forwarded to the wrapped agent."""
        return self.agent.require_history()

    def close(self) -> None:
        """Forwarded to the wrapped agent."""
        self.agent.close()
