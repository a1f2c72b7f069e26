"""Argument checks, error messages and index normalisation shared by the structures."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from rlstruct.errors import BatchSizeError, DeviceMismatchError

Index = int | slice | torch.Tensor | Sequence[int]

# uint8 is left out on purpose: torch reads a uint8 index as a (deprecated) mask, not as row ids.
INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8)


def fmt_keys(keys: Iterable[str]) -> str:
    """``['a', 'b']``: keys as a message shows them.

    >>> fmt_keys({"x": 1, "obs/y": 2})
    "['x', 'obs/y']"
    """
    return "[" + ", ".join(repr(k) for k in keys) + "]"


def check_tensors(variables: Mapping[str, Any], what: str, min_dim: int) -> None:
    """Validates types, ranks, leading sizes and devices; raises a typed error naming keys.

    With ``min_dim == 1`` (DictTensor), tensors that are all 0-d form a record (no batch dimension).

    Raises:
        TypeError: a key is not a str or a value is not a tensor.
        BatchSizeError: a tensor has fewer than ``min_dim`` dims, leading sizes differ, or 0-d and batched
            tensors are mixed.
        DeviceMismatchError: tensors are on different devices.

    >>> check_tensors({"a": torch.zeros(2), "b": torch.zeros(3)}, "DictTensor", 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    rlstruct.errors.BatchSizeError: DictTensor tensors must share their batch size: 'a' has (2,), 'b' has (3,); ...
    """
    first_key = None
    first: torch.Tensor | None = None
    record = False
    for k, v in variables.items():
        if not isinstance(k, str):
            raise TypeError(f"{what} keys must be str, got {type(k).__name__} {k!r}")
        if not isinstance(v, torch.Tensor):
            raise TypeError(
                f"{what}[{k!r}] must be a torch.Tensor, got {type(v).__name__}; wrap it with torch.as_tensor"
            )
        dim = v.dim()
        if first is not None and min_dim == 1 and (dim == 0) != record:
            zero, batched = (k, first_key) if dim == 0 else (first_key, k)
            raise BatchSizeError(
                f"{what} mixes the 0-d tensor {zero!r} with the batched tensor {batched!r} of shape "
                f"{tuple(variables[batched].shape)}: a DictTensor is either a batch [B, ...] or a record of 0-d "
                "tensors; give the 0-d one a batch dimension (unsqueeze(0), or expand to B rows), or keep them apart"
            )
        if dim < min_dim and not (min_dim == 1 and dim == 0):
            raise BatchSizeError(
                f"{what}[{k!r}] must have shape [B, T, ...], got a {dim}-d tensor of shape {tuple(v.shape)}; "
                "add the missing dimension with unsqueeze"
            )
        if first is None:
            first_key, first, record = k, v, dim == 0
            continue
        if v.shape[:min_dim] != first.shape[:min_dim]:
            name = "batch size" if min_dim == 1 else "batch and time sizes"
            raise BatchSizeError(
                f"{what} tensors must share their {name}: {first_key!r} has {tuple(first.shape[:min_dim])}, "
                f"{k!r} has {tuple(v.shape[:min_dim])}; build each tensor with the same leading dimensions"
            )
        if v.device != first.device:
            raise DeviceMismatchError(
                f"{what} tensors must be on one device: {first_key!r} is on {first.device}, "
                f"{k!r} is on {v.device}; move them with .to(device) first"
            )


def check_value(what: str, key: str, value: torch.Tensor, ref_key: str, ref: torch.Tensor, lead: int) -> None:
    """Raises when ``value`` cannot be set under ``key`` beside ``ref`` (the tensor of ``ref_key``).

    ``lead`` is the number of leading dimensions the tensors share (1 for ``[B]``, 2 for ``[B, T]``).

    Raises:
        BatchSizeError: the leading sizes differ, or one of ``value`` and ``ref`` is 0-d and the other not.
        DeviceMismatchError: ``value`` is on another device than ``ref``.
    """
    if lead == 1 and (value.dim() == 0) != (ref.dim() == 0):
        expected = "a 0-d tensor (this DictTensor is a record)" if ref.dim() == 0 else "shape [B, ...]"
        raise BatchSizeError(
            f"value for {key!r} must have {expected}, got shape {tuple(value.shape)}; a DictTensor is "
            "either a batch or a record of 0-d tensors"
        )
    if value.shape[:lead] != ref.shape[:lead]:
        if lead == 1:
            raise BatchSizeError(
                f"value for {key!r} has {value.shape[0]} rows, the {what} has {ref.shape[0]} "
                f"(key {ref_key!r}); give it {ref.shape[0]} rows"
            )
        raise BatchSizeError(
            f"value for {key!r} must have leading shape {tuple(ref.shape[:lead])}, got {tuple(value.shape)}"
        )
    if value.device != ref.device:
        raise DeviceMismatchError(
            f"value for {key!r} is on {value.device}, the {what} is on {ref.device}; "
            f"move it with .to({str(ref.device)!r})"
        )


def record_error(operation: str, keys: Iterable[str]) -> BatchSizeError:
    """The error of a batch operation asked of a record (a DictTensor of 0-d tensors with ``keys``)."""
    return BatchSizeError(
        f"{operation} needs a batch dimension, but this DictTensor is a record of 0-d tensors (keys "
        f"{fmt_keys(keys)}), e.g. losses; read its values with d[key] or d.items(), or build a batch "
        "from [B, ...] tensors (unsqueeze(0) each 0-d tensor for one row)"
    )


def missing_key(key: str, available: Iterable[str]) -> KeyError:
    """The error of a key that is not there, listing the ``available`` ones."""
    return KeyError(f"no key {key!r}; available keys: {fmt_keys(available)}")


def key_mismatch(what: str, key_sets: Sequence[Mapping[str, Any]]) -> ValueError:
    """The error of ``what`` over elements whose ``key_sets`` differ, naming the first element that differs.

    >>> print(key_mismatch("DictTensor.cat", [{"x": 0, "y": 0}, {"x": 0, "z": 0}]))
    DictTensor.cat needs the same keys everywhere: element 1 lacks ['y'] and has extra ['z'] compared to element 0
    """
    keys = key_sets[0].keys()
    for i, other in enumerate(key_sets[1:], 1):
        if other.keys() != keys:
            missing = [k for k in keys if k not in other]
            extra = [k for k in other if k not in keys]
            return ValueError(
                f"{what} needs the same keys everywhere: element {i} lacks {fmt_keys(missing)} "
                f"and has extra {fmt_keys(extra)} compared to element 0"
            )
    return ValueError(f"{what} needs the same keys everywhere")


def check_same_dtypes(what: str, per_key: Mapping[str, list[torch.Tensor]]) -> None:
    """Raises when a key's tensors have different dtypes (``torch.cat`` would promote them silently).

    Raises:
        ValueError: a key has two dtypes; the message names the key and the elements.
    """
    for k, tensors in per_key.items():
        dtypes = [t.dtype for t in tensors]
        if any(d != dtypes[0] for d in dtypes):
            i = next(i for i, d in enumerate(dtypes) if d != dtypes[0])
            raise ValueError(
                f"{what} needs one dtype per key: key {k!r} is {dtypes[0]} in element 0 and {dtypes[i]} in element "
                f"{i}; convert one of them (e.g. .to({dtypes[0]}))"
            )


def cat_failure(
    what: str, per_key: Mapping[str, list[torch.Tensor]], error: Exception, leading: int = 1
) -> ValueError:
    """Says which key made ``torch.cat`` fail, and why; only called on failure, so the happy path pays nothing.

    ``leading`` is the number of leading dimensions allowed to differ (1 for B, 2 for B and T).
    """
    for key, tensors in per_key.items():
        devices = [x.device for x in tensors]
        if any(d != devices[0] for d in devices):
            return DeviceMismatchError(
                f"{what}: key {key!r} is on several devices {[str(d) for d in devices]}; "
                "move every element to one device with .to(device) first"
            )
        tails = [tuple(x.shape[leading:]) for x in tensors]
        if any(t != tails[0] for t in tails) or any(x.dim() != tensors[0].dim() for x in tensors):
            return ValueError(f"{what}: cannot concatenate key {key!r} of shapes {[tuple(x.shape) for x in tensors]}")
    return ValueError(f"{what} failed: {error}")


def as_index(idx: Index, first: torch.Tensor) -> slice | torch.Tensor:
    """Normalises an index of the rows of ``first`` so that indexing keeps the batch dimension.

    An int ``i`` becomes ``slice(i, i + 1)``; a list becomes a tensor (of bools: a mask); a 0-d index tensor
    becomes 1-d; the result is on ``first``'s device.

    Raises:
        IndexError: an int is out of range.
        TypeError: a bool, or a tensor of another dtype than an integer or bool one.
        BatchSizeError: a bool mask does not have ``B`` entries.

    >>> as_index(-1, torch.zeros(3)), as_index([True, False, True], torch.zeros(3))
    (slice(2, 3, None), tensor([ True, False,  True]))
    """
    if not isinstance(idx, torch.Tensor):
        if isinstance(idx, bool):
            raise TypeError("index must be an int, a slice, a LongTensor or a bool mask, got bool")
        if isinstance(idx, int):
            n = first.shape[0]
            if not -n <= idx < n:
                raise IndexError(f"index {idx} is out of range for a batch of {n} rows")
            idx %= n
            return slice(idx, idx + 1)
        if isinstance(idx, slice):
            return idx
        # No forced dtype: a list of bools is a mask, not the row ids 0 and 1.
        idx = torch.as_tensor(idx)
        if idx.numel() == 0:
            idx = idx.long()
    dtype = idx.dtype
    if dtype in INDEX_DTYPES:
        if idx.dim() == 0:
            # A 0-d index would drop the batch dimension; keep it, as for an int.
            idx = idx.reshape(1)
    elif dtype == torch.bool:
        if idx.shape != first.shape[:1]:
            raise BatchSizeError(
                f"a bool mask index must have shape ({first.shape[0]},), got {tuple(idx.shape)}"
            )
    else:
        raise TypeError(f"index tensor must be an int64 (or int32) or bool tensor, got dtype {dtype}")
    if idx.device != first.device:
        idx = idx.to(first.device)
    return idx
