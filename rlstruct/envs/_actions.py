"""The check of a step's ``action["action"]`` against a gymnasium action space, shared by the envs that take any
integer or floating dtype of the right kind and cast it (the gymnasium adapters, the JAX envs)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from rlstruct.envs._base import host_copy
from rlstruct.errors import BatchSizeError, DeviceMismatchError, SpaceError

__all__ = ["ActionSpec"]

_INT_DTYPES = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64})
_FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
_CPU = torch.device("cpu")


class ActionSpec:
    """What ``action["action"]`` must look like for an action space, and a valid dummy action.

    Args:
        space: a Discrete, MultiDiscrete or Box space.
        device: where actions must be.
        box_dtype: the dtype a Box's actions are cast to (default: the Box's own).

    Attributes:
        shape: the per-row shape. np_dtype, dtype: the canonical dtype (int64 for the discrete spaces).
        integer: whether the actions are integers. dummy: a valid action (numpy).

    Raises:
        SpaceError: another space.
    """

    def __init__(self, space: gym.Space, *, device: torch.device = _CPU, box_dtype: np.dtype | None = None):
        self.device = device
        if isinstance(space, spaces.Discrete):
            self.shape, self.np_dtype, self.integer = (), np.dtype(np.int64), True
            dummy = np.asarray(space.start, dtype=np.int64)
        elif isinstance(space, spaces.MultiDiscrete):
            self.shape, self.np_dtype, self.integer = tuple(space.shape), np.dtype(np.int64), True
            dummy = np.asarray(space.start, dtype=np.int64)
        elif isinstance(space, spaces.Box):
            self.shape, self.np_dtype = tuple(space.shape), np.dtype(box_dtype or space.dtype)
            self.integer = not np.issubdtype(self.np_dtype, np.floating)
            dummy = np.clip(np.zeros(self.shape), space.low, space.high).astype(self.np_dtype)
        else:
            raise SpaceError(
                f"action_space must be Discrete, Box or MultiDiscrete, got {space}; "
                "wrap the env with a gymnasium action wrapper that exposes one of these"
            )
        self.dtype = torch.from_numpy(np.zeros((), self.np_dtype)).dtype
        self.dummy = dummy
        kind = "an integer dtype" if self.integer else "a floating dtype"
        self.expected = f"shape [B{''.join(', ' + str(s) for s in self.shape)}] and {kind} (cast to {self.dtype})"

    def check(self, action: torch.Tensor, n_rows: int) -> tuple[int, ...]:
        """Validates ``action`` (one row per running env); returns the shape it stands for, ``[n_rows,
        *shape]`` (a 1-d Box takes ``[B]`` as well as ``[B, 1]``, like the torch simulators).

        Raises:
            SpaceError: not a tensor, or the wrong per-row shape or dtype kind.
            DeviceMismatchError: not on :attr:`device`. BatchSizeError: not ``n_rows`` rows.
        """
        if not isinstance(action, torch.Tensor):
            raise SpaceError(f"action['action'] must be a torch.Tensor, got {type(action).__name__}")
        if action.device != self.device:
            raise DeviceMismatchError(
                f"action['action'] must be on {self.device} (the env's device), got {action.device}; move it with "
                f".to({str(self.device)!r}) or wrap the env in DeviceEnv"
            )
        shape = tuple(action.shape)  # read once: each tensor attribute is a call into torch
        if len(shape) == 1 and self.shape == (1,):
            shape = (shape[0], 1)
        if len(shape) == 0 or shape[1:] != self.shape:
            raise SpaceError(
                f"action['action'] must have {self.expected}, got shape {list(shape)}; "
                "give one action per running env with the action space's shape"
            )
        dtype = action.dtype
        if dtype not in (_INT_DTYPES if self.integer else _FLOAT_DTYPES):
            raise SpaceError(
                f"action['action'] must have {self.expected}, got dtype {dtype}; convert it with .to({self.dtype})"
            )
        if shape[0] != n_rows:
            raise BatchSizeError(
                f"action['action'] must have one row per running env ({n_rows}), got {shape[0]}; "
                "act on the observation_running returned by the last reset/step, in the order of its ids"
            )
        return shape

    def host_copy(self, action: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, np.ndarray]:
        """:meth:`check`, then a copy of the CPU ``action`` in the canonical dtype, as a tensor and as the array it
        views."""
        return host_copy(action, self.np_dtype, self.check(action, n_rows))
