"""The array namespaces the torch simulators' kernels are written against: torch tensors or numpy arrays.

A simulator writes its reset distribution, transition and observation once, as pure functions of arrays with
Python operators for the arithmetic and ``xp.<name>`` for the rest; ``xp`` is :class:`TorchOps` (torch tensors:
accelerators and ``compile=True``) or :class:`NumpyOps` (zero-copy numpy views of CPU tensors: the default CPU
step, where a numpy operation dispatches faster than a torch one). Both give the same bits on the CPU.

>>> import numpy as np
>>> TorchOps.frame(torch.zeros(4, 2, dtype=torch.float64)).shape, NumpyOps.frame(np.zeros((4, 2))).shape
(torch.Size([2, 4]), (2, 4))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["TorchOps", "NumpyOps"]


class TorchOps:
    """The array namespace of the torch kernels: any device, and what ``compile=True`` fuses.

    The simulators' kernels are written once against ``xp`` (this class or :class:`NumpyOps`), with
    Python operators for the arithmetic and ``xp.<name>`` for the rest, so that one code runs on
    torch tensors (accelerators, fused steps) and on zero-copy numpy views of CPU tensors.
    """

    is_numpy = False
    sin = staticmethod(torch.sin)
    cos = staticmethod(torch.cos)
    abs = staticmethod(torch.abs)
    ceil = staticmethod(torch.ceil)
    remainder = staticmethod(torch.remainder)
    where = staticmethod(torch.where)
    minimum = staticmethod(torch.minimum)
    maximum = staticmethod(torch.maximum)
    zeros_like = staticmethod(torch.zeros_like)

    @staticmethod
    def clip(x: torch.Tensor, low: Any = None, high: Any = None) -> torch.Tensor:
        return x.clamp(low, high)

    @staticmethod
    def lookup(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``table[clip(index, 0, len(table) - 1)]``: a per-action constant, the action clamped into range."""
        return table[index.clamp(0, table.shape[0] - 1)]

    stack = staticmethod(lambda rows: torch.stack(tuple(rows)))
    concat = staticmethod(lambda parts: torch.cat(tuple(parts)))
    float64 = staticmethod(lambda x: x.to(torch.float64))
    float32 = staticmethod(lambda x: x.to(torch.float32))
    false = staticmethod(lambda like: torch.zeros(like.shape, dtype=torch.bool, device=like.device))

    @staticmethod
    def full_f32(like: torch.Tensor, value: float) -> torch.Tensor:
        """``float32 [B]`` filled with ``value``, ``B`` and the device those of ``like [B]``."""
        return torch.full(like.shape, value, dtype=torch.float32, device=like.device)

    @staticmethod
    def frame(rows: Any) -> torch.Tensor:
        """``float32 [B, F]`` whose column ``f`` is ``rows[f]``: a ``[F, B]`` tensor or ``F`` tensors ``[B]``."""
        if isinstance(rows, torch.Tensor):
            if rows.dtype == torch.float32:
                # A copy whatever the shape: ``.to`` returns its input unchanged when the dtype already matches
                # (even with another memory_format asked for), and a frame must never alias the state.
                return rows.t().clone(memory_format=torch.contiguous_format)
            return rows.t().to(torch.float32, memory_format=torch.contiguous_format)
        return torch.stack(tuple(rows), dim=1).to(torch.float32)


def _on_numpy(fn: Callable) -> Callable:
    """The torch elementwise function ``fn`` applied to a numpy array, into a fresh array of its dtype."""

    def apply(x: np.ndarray) -> np.ndarray:
        out = np.empty(x.shape, dtype=x.dtype)
        fn(torch.from_numpy(x), out=torch.from_numpy(out))
        return out

    return apply


class NumpyOps:
    """The array namespace of the CPU kernels: numpy on zero-copy views of CPU tensors.

    A numpy operation dispatches faster than a torch one, and dispatch is most of a step's cost up to
    ``10**4`` envs. ``sin`` and ``cos`` are torch's (vectorized, faster than numpy's float64 ones, and the
    same bits as the torch kernels), called on the same memory.
    """

    is_numpy = True
    sin = staticmethod(_on_numpy(torch.sin))
    cos = staticmethod(_on_numpy(torch.cos))
    abs = staticmethod(np.abs)
    ceil = staticmethod(np.ceil)
    remainder = staticmethod(np.remainder)
    where = staticmethod(np.where)
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)
    zeros_like = staticmethod(np.zeros_like)

    @staticmethod
    def lookup(table: np.ndarray, index: np.ndarray) -> np.ndarray:
        return np.take(table, index, mode="clip")

    @staticmethod
    def clip(x: np.ndarray, low: Any = None, high: Any = None) -> np.ndarray:
        if high is None:
            return np.maximum(x, low)
        if low is None:
            return np.minimum(x, high)
        return np.minimum(np.maximum(x, low), high)

    # np.array of a tuple of [B] arrays is np.stack's result, at a quarter of its call overhead.
    stack = staticmethod(lambda rows: np.array(tuple(rows)))
    concat = staticmethod(lambda parts: np.concatenate(tuple(parts)))
    float64 = staticmethod(lambda x: x.astype(np.float64))
    float32 = staticmethod(lambda x: x.astype(np.float32))
    false = staticmethod(lambda like: np.zeros(like.shape, dtype=np.bool_))

    @staticmethod
    def full_f32(like: np.ndarray, value: float) -> np.ndarray:
        out = np.empty(like.shape, dtype=np.float32)
        out.fill(value)
        return out

    @staticmethod
    def frame(rows: Any) -> np.ndarray:
        if isinstance(rows, np.ndarray) and rows.shape[1] <= 512:
            return rows.T.astype(np.float32, order="C")
        # Column by column for large batches: numpy's cast of a transposed [F, B] array into C order
        # walks it F elements at a time, slower for thousands of envs.
        out = np.empty((len(rows[0]), len(rows)), dtype=np.float32)
        for f, row in enumerate(rows):
            out[:, f] = row
        return out
