"""The operations that apply to every key's tensor, written once for DictTensor and TemporalDictTensor."""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Sequence, ValuesView
from typing import Any, Self

import torch

from rlstruct.devices import DeviceLike, as_device
from rlstruct.errors import BatchSizeError
from rlstruct.structures._checks import (
    Index,
    as_index,
    cat_failure,
    check_same_dtypes,
    check_value,
    fmt_keys,
    key_mismatch,
    missing_key,
    record_error,
)


class NamedTensors:
    """Named tensors sharing ``_lead`` leading dimensions (1: ``[B, ...]``; 2: ``[B, T, ...]``), on one device.

    The mapping interface and every operation that applies to each key's tensor live here. A subclass
    builds its results through three hooks, which a TemporalDictTensor uses to carry its ``lengths``:
    ``_with_keys`` (the same rows under other keys), ``_with_rows`` (the rows ``rows`` of every tensor)
    and ``_with_each`` (every tensor passed through ``fn``).
    """

    __slots__ = ()
    variables: dict[str, torch.Tensor]
    _lead: int

    def _with_keys(self, variables: dict[str, torch.Tensor]) -> Self:
        raise NotImplementedError

    def _with_rows(self, variables: dict[str, torch.Tensor], rows: slice | torch.Tensor) -> Self:
        raise NotImplementedError

    def _with_each(self, variables: dict[str, torch.Tensor], fn: Callable[[torch.Tensor], torch.Tensor]) -> Self:
        raise NotImplementedError

    def n_elems(self) -> int:
        """The batch size ``B``."""
        raise NotImplementedError

    def device(self) -> torch.device | None:
        """The device of the tensors."""
        raise NotImplementedError

    def _record_error(self, operation: str) -> BatchSizeError | None:
        """The error of a batch operation asked of a record (0-d tensors, no rows); ``None`` otherwise."""
        for v in self.variables.values():
            if v.dim() == 0:
                return record_error(f"{type(self).__name__}.{operation}", self.variables)
            break
        return None

    # ---------------------------------------------------------------- mapping
    def keys(self) -> KeysView[str]:
        """The keys, in insertion order."""
        return self.variables.keys()

    def items(self) -> ItemsView[str, torch.Tensor]:
        """``(key, tensor)`` pairs, in insertion order."""
        return self.variables.items()

    def values(self) -> ValuesView[torch.Tensor]:
        """The tensors, in insertion order."""
        return self.variables.values()

    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            return self.variables[key]
        except KeyError:
            raise missing_key(key, self.variables) from None

    def __contains__(self, key: object) -> bool:
        return key in self.variables

    def __iter__(self) -> Iterator[str]:
        return iter(self.variables)

    def specs(self) -> dict[str, dict[str, Any]]:
        """Each key's shape after the leading dims, and dtype: ``{key: {"size": Size, "dtype": dtype}}``.

        Raises:
            BatchSizeError: the DictTensor is a record (it has no rows).

        >>> from rlstruct import TemporalDictTensor
        >>> TemporalDictTensor({"x": torch.zeros(2, 5, 3)}).specs()
        {'x': {'size': torch.Size([3]), 'dtype': torch.float32}}
        """
        error = self._record_error("specs")
        if error is not None:
            raise error
        lead = self._lead
        return {k: {"size": v.shape[lead:], "dtype": v.dtype} for k, v in self.variables.items()}

    # ------------------------------------------------------------- selecting
    def get(self, keys: Iterable[str], *, clone: bool = False) -> Self:
        """Only ``keys``, in that order: tensors shared, or cloned when ``clone`` (lengths too).

        Raises:
            TypeError: ``keys`` is a str (pass a list of keys).
            KeyError: a key is missing; the message lists the available keys.

        >>> from rlstruct import DictTensor
        >>> list(DictTensor({"x": torch.zeros(2), "y": torch.ones(2), "z": torch.ones(2)}).get(["z", "x"]).keys())
        ['z', 'x']
        """
        if isinstance(keys, str):
            raise TypeError(f"keys must be a list of keys, got the str {keys!r}; use get([{keys!r}])")
        variables = {}
        for k in keys:  # a loop, not a comprehension: cheaper for the few keys a get usually names
            variables[k] = self[k]
        if clone:
            return self._with_each({k: v.clone() for k, v in variables.items()}, torch.Tensor.clone)
        return self._with_keys(variables)

    def truncate_key(self, prefix: str) -> Self:
        """Only the keys starting with ``prefix``, with the prefix removed (``"a/b/z"``, ``"a/"`` -> ``"b/z"``).

        Raises:
            KeyError: no key of a TemporalDictTensor starts with ``prefix`` (a DictTensor gives an empty one).

        >>> from rlstruct import DictTensor
        >>> list(DictTensor({"a/b/z": torch.zeros(1), "c": torch.zeros(1)}).truncate_key("a/").keys())
        ['b/z']
        """
        n = len(prefix)
        variables = {k[n:]: v for k, v in self.variables.items() if k[:n] == prefix}
        # A TemporalDictTensor's T lives in its tensors, so it keeps at least one.
        if not variables and self._lead == 2:
            raise KeyError(f"no key starts with {prefix!r}; available keys: {fmt_keys(self.variables)}")
        return self._with_keys(variables)

    def prepend_key(self, prefix: str) -> Self:
        """Every key prefixed with ``prefix`` (tensors shared)."""
        return self._with_keys({prefix + k: v for k, v in self.variables.items()})

    def slice(self, index_from: int, index_to: int | None = None) -> Self:
        """Rows ``[index_from:index_to]`` as views; ``slice(i)`` keeps the batch dim (one row, as ``index(i)``).

        Raises:
            BatchSizeError: the DictTensor is a record.

        >>> from rlstruct import TemporalDictTensor
        >>> t = TemporalDictTensor({"x": torch.zeros(3, 4)}, torch.tensor([4, 1, 2]))
        >>> t.slice(1, 3).lengths, t.slice(2).lengths
        (tensor([1, 2]), tensor([2]))
        """
        if index_to is None:
            return self.index(index_from)
        rows = slice(index_from, index_to)
        try:
            return self._with_rows({k: v[rows] for k, v in self.variables.items()}, rows)
        except IndexError as e:
            raise self._record_error("slice") or e from None

    def index(self, index: Index) -> Self:
        """Rows selected by an int (one row, batch dim kept), a slice, a LongTensor or a bool mask ``[B]``.

        Raises:
            IndexError: an int is out of range.
            TypeError: the index is a bool, or a tensor neither of integers nor of bools.
            BatchSizeError: the DictTensor is a record, or a bool mask does not have ``B`` entries.

        >>> from rlstruct import DictTensor
        >>> d = DictTensor({"x": torch.arange(4)})
        >>> d.index(torch.tensor([3, 0]))["x"], d.index([True, False, True, False])["x"], d.index(-1)["x"]
        (tensor([3, 0]), tensor([0, 2]), tensor([3]))
        """
        variables = self.variables
        if not variables:
            return self._with_keys({})
        try:
            rows = as_index(index, next(iter(variables.values())))
            return self._with_rows({k: v[rows] for k, v in variables.items()}, rows)
        except IndexError as e:
            raise self._record_error("index") or e from None

    def unfold(self) -> list[Self]:
        """The ``B`` rows, each as a structure of one row.

        Raises:
            BatchSizeError: the DictTensor is a record.
        """
        error = self._record_error("unfold")
        if error is not None:
            raise error
        return [self.slice(i, i + 1) for i in range(self.n_elems())]

    # ------------------------------------------------------------- building
    def clone(self) -> Self:
        """A deep copy (every tensor cloned, and the lengths)."""
        return self._with_each({k: v.clone() for k, v in self.variables.items()}, torch.Tensor.clone)

    def detach(self) -> Self:
        """The same tensors detached from the autograd graph (views, no copy), e.g. losses to log."""
        return self._with_keys({k: v.detach() for k, v in self.variables.items()})

    def to(self, device: DeviceLike, *, non_blocking: bool = False) -> Self:
        """The structure on ``device``; ``self`` (no copy) when it is already there (or empty).

        >>> from rlstruct import DictTensor
        >>> d = DictTensor({"x": torch.zeros(2)})
        >>> d.to("cpu") is d, d.to("meta").device()
        (True, device(type='meta'))
        """
        d = as_device(device)
        current = self.device()
        if current is None or current == d:
            return self
        return self._with_each(
            {k: v.to(d, non_blocking=non_blocking) for k, v in self.variables.items()},
            lambda x: x.to(d, non_blocking=non_blocking),
        )

    def set(self, key: str, value: torch.Tensor) -> None:
        """Sets (or replaces) ``key`` in place, with ``value`` of the others' leading dims and device.

        On an empty DictTensor this also sets ``B`` (a 0-d ``value`` makes it a record).

        Raises:
            TypeError: ``value`` is not a tensor.
            BatchSizeError: ``value`` has other leading dims (``[B]``, or ``[B, T]`` for a TemporalDictTensor),
                or is 0-d in a batch, or batched in a record.
            DeviceMismatchError: ``value`` is on another device.

        >>> from rlstruct import DictTensor
        >>> d = DictTensor({"x": torch.zeros(2)})
        >>> d.set("y", torch.ones(2, 3))
        >>> d
        DictTensor(B=2, device=cpu, {x: (2,) torch.float32, y: (2, 3) torch.float32})
        """
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"value for {key!r} must be a torch.Tensor, got {type(value).__name__}")
        variables = self.variables
        # The lengths pin a TemporalDictTensor's B and T, so its only key is checked against itself.
        ref_key = next((k for k in variables if k != key), key if self._lead == 2 else None)
        if ref_key is not None:
            check_value(type(self).__name__, key, value, ref_key, variables[ref_key], self._lead)
        variables[key] = value

    def copy_(self, source: Self, source_indexes: Index, destination_indexes: Index) -> None:
        """In place: ``self[k][destination_indexes] = source[k][source_indexes]`` for every key of self.

        Raises:
            BatchSizeError: self or ``source`` is a record.

        >>> from rlstruct import DictTensor
        >>> d = DictTensor({"x": torch.zeros(3)})
        >>> d.copy_(DictTensor({"x": torch.tensor([7.0, 8.0])}), torch.tensor([1, 0]), torch.tensor([0, 2]))
        >>> d["x"]
        tensor([8., 0., 7.])
        """
        self._copy_keys(source, source_indexes, destination_indexes)

    def _copy_keys(self, source: NamedTensors, source_indexes: Index, into: Any) -> None:
        try:
            for k, v in self.variables.items():
                v[into] = source[k][source_indexes]
        except IndexError as e:
            raise self._record_error("copy_") or source._record_error("copy_") or e from None


def pad_time(x: torch.Tensor, T: int) -> torch.Tensor:
    """``x [B, T', ...]`` followed by zero steps up to ``T`` (``x`` itself when ``T' == T``).

    >>> pad_time(torch.ones(1, 2, dtype=torch.long), 3)
    tensor([[1, 1, 0]])
    """
    if x.shape[1] == T:
        return x
    return torch.cat([x, x.new_zeros((x.shape[0], T - x.shape[1]) + x.shape[2:])], dim=1)


def cat_keys(what: str, elements: Sequence[NamedTensors], T: int | None = None) -> dict[str, torch.Tensor]:
    """Each key's tensors concatenated along the batch dimension, zero-padded in time to ``T`` when given.

    Raises:
        ValueError: the key sets differ, or a key's dtypes or trailing shapes differ.
        DeviceMismatchError: a key's tensors are on different devices.
    """
    keys = elements[0].variables.keys()
    n = len(keys)
    # Same number of keys + every key of the first found in each (else KeyError) = same key sets.
    if any(len(d.variables) != n for d in elements):
        raise key_mismatch(what, [d.variables for d in elements])
    try:
        per_key = {k: [d.variables[k] for d in elements] for k in keys}
    except KeyError:
        raise key_mismatch(what, [d.variables for d in elements]) from None
    check_same_dtypes(what, per_key)
    try:
        if T is None:
            return {k: torch.cat(xs) for k, xs in per_key.items()}
        return {k: torch.cat([pad_time(x, T) for x in xs]) for k, xs in per_key.items()}
    except RuntimeError as e:
        raise cat_failure(what, per_key, e, leading=1 if T is None else 2) from e
