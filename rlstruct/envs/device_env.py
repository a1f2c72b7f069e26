"""DeviceEnv: the one boundary where an env's observations and actions change device."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

from rlstruct.devices import DeviceLike, check_device_exists
from rlstruct.envs._actions import DeferredActionCheck
from rlstruct.envs._base import StepResult, VecEnv
from rlstruct.errors import DeviceMismatchError
from rlstruct.structures import DictTensor

__all__ = ["DeviceEnv"]

_FORWARDED = ("get_state", "set_state")


class DeviceEnv(VecEnv):
    """A :class:`~rlstruct.envs.VecEnv` on ``to_device`` over an env on ``from_device``.

    ``step`` moves the action to ``from_device`` before delegating; observations and ids come back on
    ``to_device``. When the two devices are the same nothing is copied: the structures' ``.to`` returns
    the very objects the inner env returned. ``env_info`` stays on the CPU (the contract of every env).

    ``n_envs``, ``close``, ``action_space``, ``observation_space`` and ``autoreset`` are the inner env's;
    ``get_state``/``set_state`` are forwarded as they are (the state stays on ``from_device``) when the
    inner env has them, and are absent otherwise.

    Args:
        env: the wrapped env.
        from_device: the inner env's device (must match ``env.device`` when the env has one).
        to_device: where observations and ids are returned (the agent/batcher device).

    Attributes:
        device: ``to_device``.

    Raises:
        DeviceMismatchError: ``from_device`` differs from ``env.device``.
        DeviceUnavailableError: a device does not exist on this machine.

    >>> import gymnasium as gym
    >>> from rlstruct.envs import GymEnv
    >>> env = DeviceEnv(GymEnv([gym.make("CartPole-v1")], seed=0), "cpu", "cpu")
    >>> obs, ids = env.reset()
    >>> obs["frame"].device, env.device, env.n_envs()
    (device(type='cpu'), device(type='cpu'), 1)
    """

    def __init__(self, env: VecEnv, from_device: DeviceLike, to_device: DeviceLike):
        self.env = env
        self.from_device = check_device_exists(from_device, argument="from_device")
        self.to_device = check_device_exists(to_device, argument="to_device")
        inner = getattr(env, "device", None)
        if inner is not None and torch.device(inner) != self.from_device:
            raise DeviceMismatchError(
                f"from_device must be the env's device {torch.device(inner)}, got {self.from_device}; "
                f"pass DeviceEnv(env, {str(torch.device(inner))!r}, {str(self.to_device)!r})"
            )
        self.device = self.to_device

    @property
    def autoreset(self) -> bool:  # type: ignore[override]
        """The inner env's."""
        return self.env.autoreset

    @property
    def action_space(self) -> gym.Space:  # type: ignore[override]
        """The inner env's."""
        return self.env.action_space

    @property
    def observation_space(self) -> gym.Space:  # type: ignore[override]
        """The inner env's."""
        return self.env.observation_space

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found normally: forward the optional state API, nothing else.
        if name in _FORWARDED:
            return getattr(self.__dict__["env"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"DeviceEnv({self.env!r}, from_device={self.from_device}, to_device={self.to_device})"

    def n_envs(self) -> int:
        """The inner env's number of environments."""
        return self.env.n_envs()

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, torch.Tensor]:
        """Resets the inner env; observation and ids on ``to_device``.

        Raises:
            DeviceMismatchError: ``env_info`` is not on the CPU.
        """
        if env_info is not None and not env_info.empty() and env_info.device() != torch.device("cpu"):
            raise DeviceMismatchError(
                f"env_info must be on cpu, got {env_info.device()}; build env_info on the CPU "
                "(DeviceEnv moves observations and actions, never env_info)"
            )
        obs, ids = self.env.reset(env_info)
        to = self.to_device
        return obs.to(to), ids.to(to)

    def step(self, action: DictTensor) -> StepResult:
        """Moves ``action`` to ``from_device``, steps the inner env, returns everything on ``to_device``."""
        (obs_next, ids), (obs_running, ids_running) = self.env.step(action.to(self.from_device))
        to = self.to_device
        # Envs may return one object for both halves (nothing finished): move it once.
        o_next, i_next = obs_next.to(to), ids.to(to)
        o_run = o_next if obs_running is obs_next else obs_running.to(to)
        i_run = i_next if ids_running is ids else ids_running.to(to)
        return (o_next, i_next), (o_run, i_run)

    def deferred_action_check(self) -> DeferredActionCheck | None:
        """The inner env's (its actions are checked on ``from_device``)."""
        return self.env.deferred_action_check()

    def close(self) -> None:
        """Closes the inner env (idempotent when the inner env's close is)."""
        self.env.close()
