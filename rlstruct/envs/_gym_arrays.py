"""The numpy side of the gymnasium adapters: observation fields of a space, the action check, and the conversions
of per-env or batched observations into one array per field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from rlstruct.envs._base import host_copy
from rlstruct.errors import BatchSizeError, DeviceMismatchError, SpaceError

__all__ = [
    "RESERVED_KEYS", "Field", "ActionSpec", "observation_fields", "stack", "fill", "split", "write_flags",
    "mark_restarted", "with_rows",
]

RESERVED_KEYS = ("reward", "done", "terminated", "truncated", "initial_state", "last_action")
_INT_DTYPES = frozenset({torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64})
_FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})

class Field:
    """One observation key: where it comes from (``entry`` of a Dict space, or the whole observation)."""

    __slots__ = ("key", "entry", "shape", "dtype")

    def __init__(self, key: str, entry: str | None, shape: tuple[int, ...], dtype: np.dtype):
        self.key, self.entry, self.shape, self.dtype = key, entry, shape, dtype


def _leaf_field(space: gym.Space, key: str, entry: str | None) -> Field:
    if isinstance(space, spaces.Box):
        return Field(key, entry, tuple(space.shape), np.dtype(space.dtype))
    if isinstance(space, spaces.Discrete):
        return Field(key, entry, (), np.dtype(np.int64))
    if isinstance(space, spaces.MultiDiscrete):
        return Field(key, entry, tuple(space.shape), np.dtype(np.int64))
    if isinstance(space, spaces.MultiBinary):
        return Field(key, entry, tuple(space.shape), np.dtype(space.dtype))
    where = "observation_space" if entry is None else f"observation_space[{entry!r}]"
    raise SpaceError(
        f"{where} must be a Box, Discrete, MultiDiscrete or MultiBinary space, got {space}; "
        "flatten it with a gymnasium observation wrapper (e.g. gymnasium.wrappers.FlattenObservation)"
    )


def observation_fields(space: gym.Space) -> list[Field]:
    if not isinstance(space, spaces.Dict):
        return [_leaf_field(space, "frame", None)]
    fields = []
    for name, sub in space.spaces.items():
        if not isinstance(name, str):
            raise SpaceError(f"observation_space Dict keys must be str, got {name!r}; rename the entry")
        if name in RESERVED_KEYS:
            raise SpaceError(
                f"observation_space Dict key {name!r} collides with the key rlstruct adds; the reserved keys "
                f"are {list(RESERVED_KEYS)}; rename the entry (e.g. with gymnasium.wrappers.TransformObservation)"
            )
        if isinstance(sub, (spaces.Dict, spaces.Tuple)):
            raise SpaceError(
                f"observation_space[{name!r}] is a nested {type(sub).__name__}; only flat Dict spaces are "
                "supported; flatten it with gymnasium.wrappers.FlattenObservation or a custom wrapper"
            )
        fields.append(_leaf_field(sub, name, name))
    return fields


class ActionSpec:
    """What ``action["action"]`` must look like for an action space, and a valid dummy action."""

    def __init__(self, space: gym.Space):
        if isinstance(space, spaces.Discrete):
            self.shape, self.np_dtype, self.integer = (), np.dtype(np.int64), True
            dummy = np.asarray(space.start, dtype=np.int64)
        elif isinstance(space, spaces.MultiDiscrete):
            self.shape, self.np_dtype, self.integer = tuple(space.shape), np.dtype(np.int64), True
            dummy = np.asarray(space.start, dtype=np.int64)
        elif isinstance(space, spaces.Box):
            self.shape, self.np_dtype = tuple(space.shape), np.dtype(space.dtype)
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

    def check(self, action: torch.Tensor, n_rows: int) -> tuple[torch.Tensor, np.ndarray]:
        """Validates ``action`` (one row per running env); returns a copy in the canonical dtype, as a tensor
        and as the array it views."""
        if not isinstance(action, torch.Tensor):
            raise SpaceError(f"action['action'] must be a torch.Tensor, got {type(action).__name__}")
        if action.device.type != "cpu":
            raise DeviceMismatchError(
                f"action['action'] must be on cpu (the env's device), got {action.device}; "
                "wrap the env in DeviceEnv(env, 'cpu', agent_device) to move actions"
            )
        shape = tuple(action.shape)  # read once: each tensor attribute is a call into torch
        if len(shape) == 1 and self.shape == (1,):
            # Like the torch simulators, a 1-d Box takes ``[B]`` as well as ``[B, 1]``.
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
        return host_copy(action, self.np_dtype, shape)



def stack(fields: list[Field], observations: Sequence[Any]) -> dict[str, np.ndarray]:
    """Per-env observations (arrays, scalars or dicts of them) -> one ``[R, ...]`` array per field."""
    out = {}
    for f in fields:
        values = observations if f.entry is None else [o[f.entry] for o in observations]
        if len(values) == 0:
            out[f.key] = np.zeros((0,) + f.shape, f.dtype)
            continue
        # np.array of equal-shape arrays is np.stack's result, at a fraction of its per-call cost.
        arr = np.array(values, dtype=f.dtype)
        if arr.shape[1:] != f.shape:
            raise SpaceError(
                f"the envs returned observation {f.key!r} of shape {list(arr.shape[1:])} (stacked: {list(arr.shape)}), "
                f"but the observation space says {list(f.shape)}; fix the env or its observation_space"
            )
        out[f.key] = arr
    return out


def fill(dst: np.ndarray, observations: Sequence[Any], f: Field, rows: np.ndarray | None = None) -> None:
    """``dst[rows] = `` field ``f`` of the per-env ``observations`` (all rows when ``rows`` is None), converted to
    ``dst``'s dtype like :func:`stack`."""
    values = observations if f.entry is None else [o[f.entry] for o in observations]
    try:
        if rows is None:
            dst[...] = values
        else:
            dst[rows] = values
    except ValueError as e:
        shapes = sorted({tuple(np.shape(v)) for v in values})
        raise SpaceError(
            f"the envs returned observation {f.key!r} of shapes {[list(s) for s in shapes]}, but the observation "
            f"space says {list(f.shape)}; fix the env or its observation_space"
        ) from e


def write_flags(nxt: dict[str, np.ndarray], run: dict[str, np.ndarray], reward, term, trunc,
                 a_np: np.ndarray) -> np.ndarray:
    """Writes the reward, flags and last action of an auto-reset step into the destination arrays (every row as
    if no env finished: the caller then fixes the finished rows of ``run``); returns ``nxt["done"]``."""
    done = nxt["done"]
    nxt["reward"][...] = reward
    nxt["terminated"][...] = term
    nxt["truncated"][...] = trunc
    np.logical_or(nxt["terminated"], nxt["truncated"], out=done)
    nxt["initial_state"][...] = False
    nxt["last_action"][...] = a_np
    run["reward"][...] = nxt["reward"]
    run["done"][...] = False
    run["terminated"][...] = False
    run["truncated"][...] = False
    run["initial_state"][...] = done
    run["last_action"][...] = a_np
    return done


def split(fields: list[Field], batched: Any) -> dict[str, np.ndarray]:
    """A vector env's batched observation (array or dict of arrays) -> one ``[n, ...]`` array per field."""
    return {
        f.key: np.asarray(batched if f.entry is None else batched[f.entry]).astype(f.dtype, copy=False)
        for f in fields
    }


def mark_restarted(run: dict[str, np.ndarray], rows: np.ndarray) -> None:
    """Gives the restarted ``rows`` of the running observation the reward and last action of a fresh episode."""
    run["reward"][rows] = 0.0
    run["last_action"][rows] = 0


def with_rows(fields: dict[str, np.ndarray], rows: np.ndarray, new: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Copies of ``fields`` whose ``rows`` (indices or a bool mask) are ``new``'s."""
    out = {}
    for k, arr in fields.items():
        arr = arr.copy()
        arr[rows] = new[k]
        out[k] = arr
    return out
