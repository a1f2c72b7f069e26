"""How tensors travel through Ray's object store: as numpy arrays (pickle protocol 5, out of band), which Ray reads
without a serialisation copy. numpy has no bfloat16, float8 or complex32: those travel as a same-width integer view
and their torch dtype's name."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlstruct.batchers._buffer import TEMPORAL_PREFIXES, trajectories_from
from rlstruct.structures import Trajectories

__all__ = ["from_wire", "rebuild", "to_wire", "trajectories_to_wire"]

_NUMPY_DTYPES = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
}
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor_to_numpy(t: torch.Tensor) -> tuple[np.ndarray, str | None]:
    """A numpy view of a CPU copy of ``t`` and, when numpy lacks its dtype, the torch dtype's name."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype in _NUMPY_DTYPES:
        return t.numpy(), None
    return t.view(_INT_OF_WIDTH[t.element_size()]).numpy(), _dtype_name(t.dtype)


def _numpy_to_tensor(a: np.ndarray, dtype_name: str | None) -> torch.Tensor:
    # The array may be a read-only view of the object store: torch warns, but nothing here writes to it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(a)
    return t if dtype_name is None else t.view(getattr(torch, dtype_name))


@dataclass
class _WireTensor:
    """A tensor inside a state dict on its way through the object store."""

    array: np.ndarray
    dtype: str | None


def to_wire(obj: Any) -> Any:
    """``obj`` (a state dict, possibly nested in dicts, lists and tuples) with its tensors as numpy arrays."""
    if isinstance(obj, torch.Tensor):
        return _WireTensor(*_tensor_to_numpy(obj))
    if isinstance(obj, dict):
        return type(obj)((k, to_wire(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_wire(v) for v in obj)
    return obj


def from_wire(obj: Any) -> Any:
    """What :func:`to_wire` sent, with its tensors back (views of the arrays: no copy).

    >>> from_wire(to_wire({"w": torch.ones(2, dtype=torch.bfloat16)}))
    {'w': tensor([1., 1.], dtype=torch.bfloat16)}
    """
    if isinstance(obj, _WireTensor):
        return _numpy_to_tensor(obj.array, obj.dtype)
    if isinstance(obj, dict):
        return type(obj)((k, from_wire(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(from_wire(v) for v in obj)
    return obj


def trajectories_to_wire(traj: Trajectories) -> dict[str, Any]:
    """An actor's Trajectories as flat arrays per key (``lengths`` included), for :func:`rebuild` in the driver."""
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for k, v in [*traj.info.items(), *traj.trajectories.items(), ("lengths", traj.trajectories.lengths)]:
        arrays[k], name = _tensor_to_numpy(v)
        if name is not None:
            dtypes[k] = name
    return {"arrays": arrays, "dtypes": dtypes}


def _temporal_size(wire: dict[str, Any]) -> int:
    for k, a in wire["arrays"].items():
        if k.startswith(TEMPORAL_PREFIXES):
            return a.shape[1]
    return 0


def rebuild(wires: list[dict[str, Any] | None], device: torch.device) -> Trajectories:
    """The Trajectories of every actor's result, actor 0's rows first (``None``: an actor with no rows).

    Time is zero-padded to the longest acquisition (beyond ``lengths``, like RL_Batcher's padding).
    """
    present = [w for w in wires if w is not None]
    dtypes = present[0]["dtypes"]
    T = max(_temporal_size(w) for w in present)
    data: dict[str, torch.Tensor] = {}
    for key in present[0]["arrays"]:
        parts = [w["arrays"][key] for w in present]
        if key.startswith(TEMPORAL_PREFIXES) and any(p.shape[1] != T for p in parts):
            out = np.zeros((sum(p.shape[0] for p in parts), T) + parts[0].shape[2:], dtype=parts[0].dtype)
            o = 0
            for p in parts:
                out[o:o + p.shape[0], :p.shape[1]] = p
                o += p.shape[0]
        else:
            # The one copy out of the object store: the result must outlive the Ray references.
            out = np.concatenate(parts, axis=0)
        data[key] = _numpy_to_tensor(out, dtypes.get(key)).to(device)
    return trajectories_from(data)
