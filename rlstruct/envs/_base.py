"""The vectorized-environment contract shared by every rlstruct environment."""

from __future__ import annotations

import abc

import gymnasium as gym
import numpy as np
import torch

from rlstruct.structures import DictTensor

__all__ = ["VecEnv", "StepResult", "host_copy"]

# ((observation_next [B'], ids [B']), (observation_running [B''], ids [B'']))
StepResult = tuple[tuple[DictTensor, torch.Tensor], tuple[DictTensor, torch.Tensor]]


class VecEnv(abc.ABC):
    """``n_envs()`` environments stepped together, exchanging DictTensors.

    At any time a subset of the envs is *running*; every returned DictTensor
    comes with ``ids`` (``int64 [rows]``, on :attr:`device`): row ``i`` is env ``ids[i]``.

    * ``reset(env_info)`` restarts every env and returns ``(observation [n_envs], arange(n_envs))``.
    * ``step(action)`` takes one row per running env, in the order of the last returned ids, and returns
      ``((observation_next [B'], ids [B']), (observation_running [B''], ids [B'']))``: the observation
      each env that acted reached (before any auto-reset), then what the still-running envs act on next.
    * Episodic envs (``autoreset=False``) drop finished envs: ``ids_running = ids[~observation_next["done"]]``,
      in the same order. Auto-reset envs keep every env running; a finished env's row in
      ``observation_running`` is its fresh reset observation.

    Every observation DictTensor holds ``reward`` (float32), ``done`` (bool, terminated or truncated),
    ``terminated``, ``truncated``, ``initial_state`` (bool), ``last_action``, and the observation itself
    (``frame``, or one key per entry of a Dict space). A fresh reset observation has
    ``initial_state=True``, ``done=False`` and ``reward=0``.

    Attributes:
        device: where observations and ids live.
        autoreset: whether finished envs are reset inside ``step``.
        action_space: the single-env gymnasium action space.
        observation_space: the single-env gymnasium observation space.
    """

    device: torch.device
    autoreset: bool
    action_space: gym.Space
    observation_space: gym.Space

    @abc.abstractmethod
    def n_envs(self) -> int:
        """The number of environments."""

    @abc.abstractmethod
    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, torch.Tensor]:
        """Restarts every env; ``env_info`` (CPU, empty or ``n_envs`` rows) parametrises env ``i`` with row ``i``."""

    @abc.abstractmethod
    def step(self, action: DictTensor) -> StepResult:
        """Steps the running envs with ``action["action"]`` (one row per running env)."""

    def graph_state(self) -> tuple[str, ...] | None:
        """For CUDA-graph capture of the step loop (``RL_Batcher(..., cuda_graph=True)``): the names of the
        attributes holding every tensor ``step`` reads as state and rebinds, or ``None`` (the default) when the
        step cannot be captured.

        A capturable step runs on one CUDA device with fixed shapes (every env always running: auto-reset),
        never synchronizes with the host, and keeps all its mutable state in those tensors. A replay reads the
        tensors the capture saw, so the batcher copies the state back into them at the end of the captured
        loop and rebinds the attributes to them before every replay.
        """
        return None

    def close(self) -> None:
        """Releases the envs' resources; idempotent."""

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def host_copy(a: torch.Tensor, dtype: np.dtype, shape: tuple[int, ...]) -> tuple[torch.Tensor, np.ndarray]:
    """A copy of the CPU tensor ``a`` as ``dtype [shape]``: ``(tensor, array)`` sharing one fresh buffer.

    The copy and the cast are one numpy call: inside an env step, after the env's own numpy (or gymnasium)
    work, a torch ``copy_`` costs several times more. The env keeps the copy (as ``last_action``), so it
    never aliases a tensor the caller may reuse.
    """
    if a.requires_grad:
        a = a.detach()
    try:
        buf = np.array(a.numpy(), dtype=dtype)
        if buf.shape != shape:
            buf = buf.reshape(shape)
    except (TypeError, RuntimeError):  # dtypes numpy lacks (bfloat16), negative-bit views
        buf = np.empty(shape, dtype=dtype)
        torch.from_numpy(buf).copy_(a.reshape(shape))
    return torch.from_numpy(buf), buf
