"""The numpy side of the gymnasium adapters: the observation fields of a space, and the conversions of per-env or
batched observations into one array per field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rlstruct.errors import SpaceError

__all__ = [
    "RESERVED_KEYS", "Field", "observation_fields", "stack", "fill", "split", "write_flags",
    "mark_restarted", "with_rows",
]

RESERVED_KEYS = ("reward", "done", "terminated", "truncated", "initial_state", "last_action")

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
