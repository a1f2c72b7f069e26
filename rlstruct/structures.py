"""Batched containers of named tensors: DictTensor, TemporalDictTensor, Trajectories.

Conventions, used by every structure here:

* The first dimension of every tensor is the batch dimension ``B``; a
  :class:`TemporalDictTensor` has time as its second dimension ``T``.
* **Single-index convention**: ``slice(i)`` and ``index(i)`` with one int keep the
  batch dimension and return a batch of one row (``slice(i) == slice(i, i + 1)``).
  rlstructures dropped the batch dimension in ``DictTensor.slice(i)`` but kept it
  in ``TemporalDictTensor.slice(i)``; here both keep it.
* ``to(device)`` returns the structure itself when it is already on ``device``
  (no copy); use ``clone()`` for a copy.
* Public constructors validate (one device, one batch size); operations that
  cannot break the invariants build their result without re-validating, so that
  the containers cost little more than a plain dict of tensors.
* **Records**: a DictTensor whose tensors are all 0-d (e.g.
  ``DictTensor({"loss": x.mean(), "entropy": h.mean()})``, how rlstructures programs
  return their losses) is a record without a batch dimension. Everything that does not
  need rows works on it (``keys``, ``[]``, ``items``, ``values``, ``in``, ``get``,
  ``clone``, ``detach``, ``to``, ``set`` of another 0-d tensor, ``prepend_key``,
  ``truncate_key``, ``+`` with another record, ``variables``, printing, pytree); batch
  operations (``n_elems``, ``specs``, ``slice``, ``index``, ``unfold``, ``cat``,
  ``copy_``, ``masked_dicttensor``, a ``Trajectories`` info) raise
  :class:`~rlstruct.errors.BatchSizeError` saying so. Mixing 0-d and batched tensors
  in one DictTensor stays an error.
"""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, Sequence, ValuesView
from typing import Any, Self

import torch
import torch.utils._pytree as pytree

from rlstruct.devices import DeviceLike, as_device
from rlstruct.errors import BatchSizeError, DeviceMismatchError, MissingDependencyError

__all__ = [
    "DictTensor",
    "TemporalDictTensor",
    "Trajectories",
    "masked_tensor",
    "masked_dicttensor",
]

Index = int | slice | torch.Tensor | Sequence[int]


def _fmt_keys(keys: Iterable[str]) -> str:
    return "[" + ", ".join(repr(k) for k in keys) + "]"


def _check_tensors(variables: Mapping[str, Any], what: str, min_dim: int) -> None:
    """Validates types, ranks, leading sizes and devices; raises a typed error naming keys.

    With ``min_dim == 1`` (DictTensor), tensors that are all 0-d form a record (no batch dimension).
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


def _record_error(operation: str, d: DictTensor) -> BatchSizeError:
    """The error of a batch operation asked of a record (a DictTensor of 0-d tensors)."""
    return BatchSizeError(
        f"{operation} needs a batch dimension, but this DictTensor is a record of 0-d tensors (keys "
        f"{_fmt_keys(d.variables)}), e.g. losses; read its values with d[key] or d.items(), or build a batch "
        "from [B, ...] tensors (unsqueeze(0) each 0-d tensor for one row)"
    )


def _missing_key(key: str, available: Iterable[str]) -> KeyError:
    return KeyError(f"no key {key!r}; available keys: {_fmt_keys(available)}")


def _key_mismatch(what: str, elements: Sequence[DictTensor | TemporalDictTensor]) -> ValueError:
    keys = elements[0].variables.keys()
    for i, d in enumerate(elements[1:], 1):
        if d.variables.keys() != keys:
            missing = [k for k in keys if k not in d.variables]
            extra = [k for k in d.variables if k not in keys]
            return ValueError(
                f"{what} needs the same keys everywhere: element {i} lacks {_fmt_keys(missing)} "
                f"and has extra {_fmt_keys(extra)} compared to element 0"
            )
    return ValueError(f"{what} needs the same keys everywhere")


def _check_same_dtypes(what: str, per_key: Mapping[str, list[torch.Tensor]]) -> None:
    """Raises when a key's tensors have different dtypes (``torch.cat`` would promote them silently)."""
    for k, tensors in per_key.items():
        dtypes = [t.dtype for t in tensors]
        if any(d != dtypes[0] for d in dtypes):
            i = next(i for i, d in enumerate(dtypes) if d != dtypes[0])
            raise ValueError(
                f"{what} needs one dtype per key: key {k!r} is {dtypes[0]} in element 0 and {dtypes[i]} in element "
                f"{i}; convert one of them (e.g. .to({dtypes[0]}))"
            )


def _cat_failure(
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


# uint8 is left out on purpose: torch reads a uint8 index as a (deprecated) mask, not as row ids.
_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8)


def _as_index(idx: Index, first: torch.Tensor) -> slice | torch.Tensor:
    """Normalises an index of the rows of ``first`` so that indexing keeps the batch dimension."""
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
    if dtype in _INDEX_DTYPES:
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


def _check_value(what: str, key: str, value: torch.Tensor, ref_key: str, ref: torch.Tensor, lead: int) -> None:
    """Raises when ``value`` cannot join ``ref``'s structure under ``key`` (type, leading dims, device)."""
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


def _pad_time(x: torch.Tensor, T: int) -> torch.Tensor:
    """``x [B, T', ...]`` followed by zero steps up to ``T`` (``x`` itself when ``T' == T``)."""
    if x.shape[1] == T:
        return x
    return torch.cat([x, x.new_zeros((x.shape[0], T - x.shape[1]) + x.shape[2:])], dim=1)


def _cat_keys(what: str, elements: Sequence[_PerKey], T: int | None = None) -> dict[str, torch.Tensor]:
    """Each key's tensors concatenated along the batch dimension (zero-padded in time to ``T`` when given).

    Raises:
        ValueError: the key sets differ, or a key's dtypes or trailing shapes differ.
        DeviceMismatchError: a key's tensors are on different devices.
    """
    keys = elements[0].variables.keys()
    n = len(keys)
    # Same number of keys + every key of the first found in each (else KeyError) = same key sets.
    if any(len(d.variables) != n for d in elements):
        raise _key_mismatch(what, elements)
    try:
        per_key = {k: [d.variables[k] for d in elements] for k in keys}
    except KeyError:
        raise _key_mismatch(what, elements) from None
    _check_same_dtypes(what, per_key)
    try:
        if T is None:
            return {k: torch.cat(xs) for k, xs in per_key.items()}
        return {k: torch.cat([_pad_time(x, T) for x in xs]) for k, xs in per_key.items()}
    except RuntimeError as e:
        raise _cat_failure(what, per_key, e, leading=1 if T is None else 2) from e


class _PerKey:
    """The operations that apply to every key's tensor, written once for DictTensor and TemporalDictTensor.

    A subclass holds ``variables`` whose tensors share ``_lead`` leading dimensions (1: ``[B]``; 2: ``[B, T]``)
    and builds its results through three hooks: ``_with_keys`` (the same rows under other keys),
    ``_with_rows`` (the rows ``rows`` of every tensor) and ``_with_each`` (every tensor through ``fn``).
    A TemporalDictTensor's ``lengths`` follow the rows and ``fn`` there; a DictTensor has nothing more.
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
        raise NotImplementedError

    def device(self) -> torch.device | None:
        raise NotImplementedError

    def _record_error(self, operation: str) -> BatchSizeError | None:
        """The error of a batch operation asked of a record (0-d tensors, no rows); ``None`` otherwise."""
        for v in self.variables.values():
            if v.dim() == 0:
                return _record_error(f"{type(self).__name__}.{operation}", self)
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
            raise _missing_key(key, self.variables) from None

    def __contains__(self, key: object) -> bool:
        return key in self.variables

    def __iter__(self) -> Iterator[str]:
        return iter(self.variables)

    def specs(self) -> dict[str, dict[str, Any]]:
        """The shape after the leading dims and the dtype of each key: ``{key: {"size": Size, "dtype": dtype}}``.

        Raises:
            BatchSizeError: the DictTensor is a record (it has no rows).
        """
        error = self._record_error("specs")
        if error is not None:
            raise error
        lead = self._lead
        return {k: {"size": v.shape[lead:], "dtype": v.dtype} for k, v in self.variables.items()}

    # ------------------------------------------------------------- selecting
    def get(self, keys: Iterable[str], *, clone: bool = False) -> Self:
        """Only ``keys``, in that order; tensors shared, or cloned when ``clone`` (with a TemporalDictTensor's lengths).

        Raises:
            TypeError: ``keys`` is a str (pass a list of keys).
            KeyError: a key is missing; the message lists the available keys.
        """
        if isinstance(keys, str):
            raise TypeError(f"keys must be a list of keys, got the str {keys!r}; use get([{keys!r}])")
        if clone:
            return self._with_each({k: self[k].clone() for k in keys}, torch.Tensor.clone)
        return self._with_keys({k: self[k] for k in keys})

    def truncate_key(self, prefix: str) -> Self:
        """Only the keys starting with ``prefix``, with the prefix removed (``"a/b/z"``, ``"a/"`` -> ``"b/z"``).

        Raises:
            KeyError: no key of a TemporalDictTensor starts with ``prefix`` (a DictTensor gives an empty one).
        """
        n = len(prefix)
        variables = {k[n:]: v for k, v in self.variables.items() if k[:n] == prefix}
        # A TemporalDictTensor holds T in its tensors, so it keeps at least one.
        if not variables and self._lead == 2:
            raise KeyError(f"no key starts with {prefix!r}; available keys: {_fmt_keys(self.variables)}")
        return self._with_keys(variables)

    def prepend_key(self, prefix: str) -> Self:
        """Every key prefixed with ``prefix`` (tensors shared)."""
        return self._with_keys({prefix + k: v for k, v in self.variables.items()})

    def slice(self, index_from: int, index_to: int | None = None) -> Self:
        """Rows ``[index_from:index_to]`` as views; ``slice(i)`` keeps the batch dim (one row).

        Raises:
            BatchSizeError: the DictTensor is a record.
        """
        if index_to is None:
            return self.index(index_from)
        rows = slice(index_from, index_to)
        try:
            return self._with_rows({k: v[rows] for k, v in self.variables.items()}, rows)
        except IndexError as e:
            raise self._record_error("slice") or e from None

    def index(self, index: Index) -> Self:
        """Rows selected by an int (one row, batch dim kept), a slice, a LongTensor or a bool mask.

        Raises:
            BatchSizeError: the DictTensor is a record, or a bool mask does not have ``B`` entries.
            IndexError: an int is out of range.
        """
        variables = self.variables
        if not variables:
            return self._with_keys({})
        try:
            rows = _as_index(index, next(iter(variables.values())))
            return self._with_rows({k: v[rows] for k, v in variables.items()}, rows)
        except IndexError as e:
            raise self._record_error("index") or e from None

    def unfold(self) -> list[Self]:
        """The ``B`` rows, each as a structure of one row."""
        error = self._record_error("unfold")
        if error is not None:
            raise error
        return [self.slice(i, i + 1) for i in range(self.n_elems())]

    # ------------------------------------------------------------- building
    def clone(self) -> Self:
        """A deep copy (every tensor cloned, a TemporalDictTensor's lengths too)."""
        return self._with_each({k: v.clone() for k, v in self.variables.items()}, torch.Tensor.clone)

    def detach(self) -> Self:
        """The same tensors detached from the autograd graph (views, no copy), e.g. losses to log."""
        return self._with_keys({k: v.detach() for k, v in self.variables.items()})

    def to(self, device: DeviceLike, *, non_blocking: bool = False) -> Self:
        """The structure on ``device``; ``self`` (no copy) when it is already there."""
        d = as_device(device)
        current = self.device()
        if current is None or current == d:
            return self
        return self._with_each(
            {k: v.to(d, non_blocking=non_blocking) for k, v in self.variables.items()},
            lambda x: x.to(d, non_blocking=non_blocking),
        )

    def set(self, key: str, value: torch.Tensor) -> None:
        """Sets (or replaces) ``key`` in place; ``value`` has the leading dims (``[B]``, or ``[B, T]`` for a
        TemporalDictTensor) and the device of the other keys. On an empty DictTensor this also sets B (a 0-d
        ``value`` makes it a record).

        Raises:
            TypeError: ``value`` is not a tensor.
            BatchSizeError: ``value`` has other leading dims, or is 0-d in a batch, or batched in a record.
            DeviceMismatchError: ``value`` is on another device.
        """
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"value for {key!r} must be a torch.Tensor, got {type(value).__name__}")
        variables = self.variables
        # The lengths pin a TemporalDictTensor's B and T, so its only key is checked against itself.
        ref_key = next((k for k in variables if k != key), key if self._lead == 2 else None)
        if ref_key is not None:
            _check_value(type(self).__name__, key, value, ref_key, variables[ref_key], self._lead)
        variables[key] = value

    def copy_(self, source: Self, source_indexes: Index, destination_indexes: Index) -> None:
        """In place: ``self[k][destination_indexes] = source[k][source_indexes]`` for every key of self.

        Raises:
            BatchSizeError: self or ``source`` is a record.
        """
        self._copy_keys(source, source_indexes, destination_indexes)

    def _copy_keys(self, source: _PerKey, source_indexes: Index, into: Any) -> None:
        try:
            for k, v in self.variables.items():
                v[into] = source[k][source_indexes]
        except IndexError as e:
            raise self._record_error("copy_") or source._record_error("copy_") or e from None


class DictTensor(_PerKey):
    """A batch of named tensors: ``{key: Tensor[B, ...]}``, all on one device.

    Invariant: every tensor has at least one dimension, the same first size
    ``B`` and the same device. A DictTensor with no key is *empty*
    (``empty()``), which is different from one with ``B == 0`` rows.

    A DictTensor whose tensors are all 0-d is a *record* (:meth:`is_record`): named
    scalars without a batch dimension, such as the losses an rlstructures program
    returns. What needs no rows works on it; batch operations raise
    :class:`~rlstruct.errors.BatchSizeError` (see the module docstring).

    Args:
        variables: the named tensors (the mapping is copied, the tensors are not).

    Raises:
        TypeError: a key is not a str or a value is not a tensor.
        BatchSizeError: tensors do not share their first size, or 0-d and batched tensors are mixed.
        DeviceMismatchError: tensors are on different devices.

    >>> d = DictTensor({"x": torch.zeros(3, 2), "y": torch.arange(3)})
    >>> d.n_elems(), d.specs()["x"]["size"]
    (3, torch.Size([2]))
    >>> d.slice(1)["y"]
    tensor([1])
    >>> losses = DictTensor({"loss": torch.tensor(0.5), "entropy": torch.tensor(0.25)})
    >>> losses.is_record(), losses["loss"].item(), losses
    (True, 0.5, DictTensor(record, device=cpu, {loss: 0.5, entropy: 0.25}))
    """

    __slots__ = ("variables",)
    _lead = 1

    def __init__(self, variables: Mapping[str, torch.Tensor] | None = None):
        v = {} if variables is None else dict(variables)
        _check_tensors(v, "DictTensor", 1)
        self.variables: dict[str, torch.Tensor] = v

    @classmethod
    def _trusted(cls, variables: dict[str, torch.Tensor]) -> DictTensor:
        # For results of operations that preserve the invariants: no re-validation.
        d = _object_new(cls)
        d.variables = variables
        return d

    # A DictTensor has no state beside its tensors: every hook just wraps the new variables.
    def _with_keys(self, variables: dict[str, torch.Tensor], *_: Any) -> DictTensor:
        d = _object_new(DictTensor)
        d.variables = variables
        return d

    _with_rows = _with_each = _with_keys

    # ---------------------------------------------------------------- reading
    def n_elems(self) -> int:
        """The batch size ``B`` (0 when empty).

        Raises:
            BatchSizeError: the DictTensor is a record (0-d tensors, no batch dimension).
        """
        for v in self.variables.values():
            try:
                return v.shape[0]
            except IndexError:
                raise _record_error("DictTensor.n_elems", self) from None
        return 0

    def is_record(self) -> bool:
        """True when the tensors are 0-d (a record of named scalars, no batch dimension); False when empty."""
        for v in self.variables.values():
            return v.dim() == 0
        return False

    def empty(self) -> bool:
        """True when there is no key (a DictTensor of ``B == 0`` rows is not empty)."""
        return not self.variables

    def device(self) -> torch.device | None:
        """The device of the tensors, or ``None`` when empty."""
        for v in self.variables.values():
            return v.device
        return None

    def __repr__(self) -> str:
        if not self.variables:
            return "DictTensor({})"
        if self.is_record():
            # A record's values are what one prints it for (logging losses); off the meta device they can be read.
            fields = ", ".join(
                f"{k}: {v.dtype}" if v.device.type == "meta" else f"{k}: {v.item()!r}"
                for k, v in self.variables.items()
            )
            return f"DictTensor(record, device={self.device()}, {{{fields}}})"
        fields = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self.variables.items())
        return f"DictTensor(B={self.n_elems()}, device={self.device()}, {{{fields}}})"

    # ------------------------------------------------------------- building
    def __add__(self, other: DictTensor) -> DictTensor:
        """The union of two DictTensors with disjoint keys (tensors shared)."""
        if not isinstance(other, DictTensor):
            return NotImplemented
        if other.empty():
            return self
        if self.empty():
            return other
        common = [k for k in other.variables if k in self.variables]
        if common:
            raise ValueError(f"cannot add DictTensors that share keys {_fmt_keys(common)}; rename one side")
        merged = {**self.variables, **other.variables}
        _check_tensors(merged, "DictTensor", 1)
        return _dt(merged)

    @staticmethod
    def cat(dicts: Sequence[DictTensor]) -> DictTensor:
        """Concatenates along the batch dimension.

        Empty DictTensors (no key) in ``dicts`` are skipped; the others must have the same keys
        (in any order; the result follows the first one's order). When a single non-empty
        element remains it is returned as is (no copy).

        Raises:
            ValueError: the key sets differ (the message says which keys), or a key's per-row shapes or dtypes
                differ.
            DeviceMismatchError: the elements are on different devices.
            BatchSizeError: an element is a record (0-d tensors): stack records with
                ``DictTensor({k: torch.stack([r[k] for r in records]) for k in records[0].keys()})``.

        >>> DictTensor.cat([DictTensor({"x": torch.zeros(2)}), DictTensor({"x": torch.ones(1)})])["x"]
        tensor([0., 0., 1.])
        """
        dicts = [d for d in dicts if d.variables]
        if not dicts:
            return _dt({})
        for d in dicts:
            if d.is_record():
                raise BatchSizeError(
                    f"DictTensor.cat concatenates rows, but an element is a record of 0-d tensors (keys "
                    f"{_fmt_keys(d.variables)}); stack records into a batch with "
                    "DictTensor({k: torch.stack([r[k] for r in records]) for k in records[0].keys()})"
                )
        if len(dicts) == 1:
            return dicts[0]
        return _dt(_cat_keys("DictTensor.cat", dicts))

    # ----------------------------------------------------------- interop
    def to_tensordict(self):
        """This DictTensor as a ``tensordict.TensorDict`` of batch size ``[B]`` (tensors shared)."""
        TensorDict = _import_tensordict()
        batch_size = [] if self.is_record() else [self.n_elems()]
        return TensorDict(dict(self.variables), batch_size=batch_size, device=self.device())

    @staticmethod
    def from_tensordict(td) -> DictTensor:
        """A DictTensor from a ``tensordict.TensorDict`` (nested keys joined with ``/``)."""
        _import_tensordict()
        flat = td.flatten_keys("/")
        return DictTensor({k: v for k, v in flat.items()})


_object_new = object.__new__


# Results of operations that keep the invariants are built with these, skipping validation and a
# classmethod call: the container then costs about one Python object over a plain dict
# (benchmarks/structures.py measures it).
def _dt(variables: dict[str, torch.Tensor]) -> DictTensor:
    d = _object_new(DictTensor)
    d.variables = variables
    return d


def _tdt(variables: dict[str, torch.Tensor], lengths: torch.Tensor) -> TemporalDictTensor:
    t = _object_new(TemporalDictTensor)
    t.variables = variables
    t.lengths = lengths
    return t


def _import_tensordict():
    try:
        from tensordict import TensorDict
    except ImportError as e:
        raise MissingDependencyError(
            "tensordict is not installed; install it with `pip install tensordict` to use "
            "to_tensordict/from_tensordict"
        ) from e
    return TensorDict

class TemporalDictTensor(_PerKey):
    """A batch of ``B`` sequences of ``T`` steps: ``{key: Tensor[B, T, ...]}`` plus ``lengths: int64 [B]``.

    Row ``b`` holds ``lengths[b]`` valid steps; positions ``t >= lengths[b]`` are
    padding whose content is unspecified (use :meth:`mask`).

    Args:
        variables: the named tensors, each ``[B, T, ...]``.
        lengths: ``int64 [B]`` on the tensors' device; ``None`` means every row is full (length ``T``).

    Raises:
        ValueError: ``variables`` is empty.
        BatchSizeError: tensors do not share ``B`` and ``T``, or ``lengths`` is not ``[B]``.
        DeviceMismatchError: tensors, or ``lengths``, are on different devices.
        TypeError: ``lengths`` is not an integer tensor.

    >>> tdt = TemporalDictTensor({"x": torch.zeros(2, 3)}, torch.tensor([1, 3]))
    >>> tdt.mask()
    tensor([[1., 0., 0.],
            [1., 1., 1.]])
    """

    __slots__ = ("variables", "lengths")
    _lead = 2

    def __init__(self, variables: Mapping[str, torch.Tensor], lengths: torch.Tensor | None = None):
        v = dict(variables)
        if not v:
            raise ValueError("TemporalDictTensor needs at least one tensor [B, T, ...]; got an empty mapping")
        _check_tensors(v, "TemporalDictTensor", 2)
        first = next(iter(v.values()))
        B, T = first.shape[0], first.shape[1]
        if lengths is None:
            lengths = torch.full((B,), T, dtype=torch.int64, device=first.device)
        else:
            if not isinstance(lengths, torch.Tensor):
                lengths = torch.as_tensor(lengths, dtype=torch.int64, device=first.device)
            if lengths.dtype.is_floating_point or lengths.dtype == torch.bool or lengths.is_complex():
                raise TypeError(f"lengths must be an int64 tensor [B], got dtype {lengths.dtype}")
            if lengths.shape != (B,):
                raise BatchSizeError(
                    f"lengths must have shape ({B},) (one length per row), got {tuple(lengths.shape)}"
                )
            if lengths.device != first.device:
                raise DeviceMismatchError(
                    f"lengths is on {lengths.device} but the tensors are on {first.device}; "
                    f"move lengths with .to({str(first.device)!r})"
                )
            if lengths.dtype != torch.int64:
                lengths = lengths.long()
            # Checking values costs a host sync on an accelerator: only done for CPU tensors.
            if lengths.device.type == "cpu" and B > 0 and (int(lengths.min()) < 0 or int(lengths.max()) > T):
                raise ValueError(
                    f"lengths must lie in [0, T={T}], got min {int(lengths.min())}, max {int(lengths.max())}; "
                    "a row holds at most T steps"
                )
        self.variables: dict[str, torch.Tensor] = v
        self.lengths: torch.Tensor = lengths

    @classmethod
    def _trusted(cls, variables: dict[str, torch.Tensor], lengths: torch.Tensor) -> TemporalDictTensor:
        t = _object_new(cls)
        t.variables = variables
        t.lengths = lengths
        return t

    def _with_keys(self, variables: dict[str, torch.Tensor]) -> TemporalDictTensor:
        return _tdt(variables, self.lengths)

    def _with_rows(self, variables: dict[str, torch.Tensor], rows: slice | torch.Tensor) -> TemporalDictTensor:
        return _tdt(variables, self.lengths[rows])

    def _with_each(
        self, variables: dict[str, torch.Tensor], fn: Callable[[torch.Tensor], torch.Tensor]
    ) -> TemporalDictTensor:
        return _tdt(variables, fn(self.lengths))

    # ---------------------------------------------------------------- reading
    def n_elems(self) -> int:
        """The batch size ``B``."""
        return self.lengths.shape[0]

    def temporal_size(self) -> int:
        """The time dimension ``T`` (the longest possible row)."""
        return next(iter(self.variables.values())).shape[1]

    def device(self) -> torch.device:
        """The device of the tensors and the lengths."""
        return self.lengths.device

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self.variables.items())
        return f"TemporalDictTensor(B={self.n_elems()}, T={self.temporal_size()}, device={self.device()}, {{{fields}}})"

    def mask(self) -> torch.Tensor:
        """``float32 [B, T]``: 1 where ``t < lengths[b]``, else 0."""
        t = torch.arange(self.temporal_size(), device=self.lengths.device)
        return (t.unsqueeze(0) < self.lengths.unsqueeze(1)).float()

    def full(self) -> bool:
        """True when every row has length ``T``."""
        return bool((self.lengths == self.temporal_size()).all())

    # ------------------------------------------------------------- selecting
    def shorten(self) -> TemporalDictTensor:
        """The same rows with ``T`` cut to ``lengths.max()`` (views; one host sync)."""
        m = int(self.lengths.max()) if self.n_elems() > 0 else 0
        if m == self.temporal_size():
            return self
        return _tdt({k: v[:, :m] for k, v in self.variables.items()}, self.lengths.clone())

    def temporal_slice(self, index_from: int, index_to: int) -> TemporalDictTensor:
        """Steps ``[index_from:index_to]`` of every row; lengths clamped to ``[0, index_to - index_from]``.

        Bounds past ``T`` are clipped to ``T``, as in Python slicing.

        Raises:
            ValueError: a bound is negative (counting from the end is ambiguous with padded rows).
        """
        if index_from < 0 or index_to < 0:
            raise ValueError(
                f"temporal_slice bounds must be >= 0, got ({index_from}, {index_to}); "
                "compute the steps from lengths for end-relative slicing"
            )
        T = self.temporal_size()
        a, b = max(0, min(index_from, T)), max(0, min(index_to, T))
        b = max(a, b)
        lengths = (self.lengths - a).clamp(min=0, max=b - a)
        return _tdt({k: v[:, a:b] for k, v in self.variables.items()}, lengths)

    def temporal_index(self, t: int) -> DictTensor:
        """Step ``t`` of every row as a DictTensor ``[B, ...]`` (rows with ``t >= length`` give padding)."""
        return _dt({k: v[:, t] for k, v in self.variables.items()})

    def temporal_multi_index(self, index_t: torch.Tensor) -> DictTensor:
        """Step ``index_t[b]`` of each row ``b`` as a DictTensor ``[B, ...]``."""
        rows = torch.arange(self.n_elems(), device=self.device())
        index_t = index_t.to(self.device())
        return _dt({k: v[rows, index_t] for k, v in self.variables.items()})

    def masked_temporal_index(self, t: int) -> tuple[DictTensor, torch.Tensor]:
        """Step ``t`` of the rows with ``t < lengths[b]``, and those row indices (LongTensor)."""
        rows = torch.nonzero(self.lengths > t, as_tuple=False).squeeze(1)
        return _dt({k: v[rows, t] for k, v in self.variables.items()}), rows

    # ------------------------------------------------------------- building
    def expand(self, new_batch_size: int) -> TemporalDictTensor:
        """The same rows followed by zero rows of length 0 up to ``new_batch_size`` rows (dtypes kept).

        Raises:
            BatchSizeError: ``new_batch_size`` is smaller than ``B``.
        """
        B = self.n_elems()
        if new_batch_size < B:
            raise BatchSizeError(f"new_batch_size must be >= the current batch size {B}, got {new_batch_size}")
        if new_batch_size == B:
            return self
        n = new_batch_size - B
        v = {k: torch.cat([x, x.new_zeros((n,) + x.shape[1:])]) for k, x in self.variables.items()}
        return _tdt(v, torch.cat([self.lengths, self.lengths.new_zeros(n)]))

    def copy_(self, source: TemporalDictTensor, source_indexes: Index, destination_indexes: Index) -> None:
        """In place: rows ``source_indexes`` of ``source`` into rows ``destination_indexes`` of self.

        The first ``source.temporal_size()`` steps of the destination rows are written, and their lengths copied.

        Raises:
            BatchSizeError: ``source`` is longer in time than self.
        """
        Ts, T = source.temporal_size(), self.temporal_size()
        if Ts > T:
            raise BatchSizeError(f"source has T={Ts} steps, more than this structure's T={T}; shorten() it first")
        self._copy_keys(source, source_indexes, (destination_indexes, slice(None, Ts)))
        self.lengths[destination_indexes] = source.lengths[source_indexes]

    @staticmethod
    def cat(tdts: Sequence[TemporalDictTensor]) -> TemporalDictTensor:
        """Concatenates along the batch dimension, zero-padding in time to the longest ``T``.

        The padding keeps each key's dtype; the lengths are concatenated. A single element is
        returned as is (no copy).

        Raises:
            ValueError: ``tdts`` is empty, the key sets differ (the message says which keys), or a
                key's per-step shapes or dtypes differ.
            DeviceMismatchError: the elements are on different devices.

        >>> a = TemporalDictTensor({"x": torch.ones(1, 2, dtype=torch.long)})
        >>> b = TemporalDictTensor({"x": torch.ones(1, 3, dtype=torch.long)}, torch.tensor([1]))
        >>> c = TemporalDictTensor.cat([a, b])
        >>> c["x"], c.lengths
        (tensor([[1, 1, 0],
                [1, 1, 1]]), tensor([2, 1]))
        """
        if not tdts:
            raise ValueError("TemporalDictTensor.cat needs at least one element")
        if len(tdts) == 1:
            return tdts[0]
        T = max(d.temporal_size() for d in tdts)
        return _tdt(_cat_keys("TemporalDictTensor.cat", tdts, T), torch.cat([d.lengths for d in tdts]))


class Trajectories:
    """``B`` trajectories: per-trajectory ``info`` (``DictTensor [B, ...]``) and their steps
    (``TemporalDictTensor [B, T, ...]``).

    Invariant: ``info`` is empty or has ``B`` rows on the trajectories' device.

    Raises:
        BatchSizeError: ``info`` does not have ``B`` rows.
        DeviceMismatchError: ``info`` is on another device.
    """

    __slots__ = ("info", "trajectories")

    def __init__(self, info: DictTensor, trajectories: TemporalDictTensor):
        if not info.empty():
            if info.n_elems() != trajectories.n_elems():
                raise BatchSizeError(
                    f"info has {info.n_elems()} rows but trajectories has {trajectories.n_elems()}; "
                    "give one info row per trajectory"
                )
            if info.device() != trajectories.device():
                raise DeviceMismatchError(
                    f"info is on {info.device()} but trajectories is on {trajectories.device()}; "
                    "move both to one device"
                )
        self.info = info
        self.trajectories = trajectories

    def __repr__(self) -> str:
        return f"Trajectories(info={self.info!r}, trajectories={self.trajectories!r})"

    def n_elems(self) -> int:
        """The number of trajectories ``B``."""
        return self.trajectories.n_elems()

    def device(self) -> torch.device:
        """The device of the trajectories (and of a non-empty info)."""
        return self.trajectories.device()

    def to(self, device: DeviceLike, *, non_blocking: bool = False) -> Trajectories:
        """Both parts on ``device``; ``self`` when already there."""
        d = as_device(device)
        if self.device() == d:
            return self
        return Trajectories(
            self.info.to(d, non_blocking=non_blocking), self.trajectories.to(d, non_blocking=non_blocking)
        )

    def clone(self) -> Trajectories:
        """A copy that shares no memory with ``self`` (each tensor keeps its strides); e.g. to keep what a
        ``zero_copy`` batcher returned beyond its lifetime."""
        return Trajectories(self.info.clone(), self.trajectories.clone())

    def index(self, index: Index) -> Trajectories:
        """The selected trajectories (same index rules as :meth:`DictTensor.index`)."""
        return Trajectories(self.info.index(index), self.trajectories.index(index))

    def sample(self, n: int, *, generator: torch.Generator | None = None) -> Trajectories:
        """``n`` trajectories drawn uniformly without replacement.

        Raises:
            ValueError: ``n`` is larger than the number of trajectories.
        """
        B = self.n_elems()
        if not 0 <= n <= B:
            raise ValueError(f"n must be in [0, {B}] (sampling without replacement), got {n}")
        idx = torch.randperm(B, generator=generator)[:n].to(self.device())
        return self.index(idx)

    @staticmethod
    def cat(trajectories: Sequence[Trajectories]) -> Trajectories:
        """Concatenates along the batch dimension (time zero-padded to the longest)."""
        infos = [t.info for t in trajectories]
        if any(i.variables for i in infos) and not all(i.variables for i in infos):
            raise _key_mismatch("Trajectories.cat (info)", infos)
        return Trajectories(
            DictTensor.cat([t.info for t in trajectories]),
            TemporalDictTensor.cat([t.trajectories for t in trajectories]),
        )


def masked_tensor(tensor0: torch.Tensor, tensor1: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row-wise select: row ``b`` of ``tensor1`` where ``mask[b]`` is true, else of ``tensor0``.

    Works at any rank, keeps the dtype of ``tensor0`` (``tensor1`` is cast to it)
    and never blends values (a NaN in the unselected tensor does not leak).

    Args:
        tensor0: ``[B, ...]``.
        tensor1: ``[B, ...]``, same shape.
        mask: ``[B]`` of bool, or of numbers where non-zero means true.

    >>> masked_tensor(torch.zeros(3), torch.ones(3), torch.tensor([True, False, True]))
    tensor([1., 0., 1.])
    """
    if mask.dim() != 1 or mask.shape[0] != tensor0.shape[0] or tensor0.shape != tensor1.shape:
        raise BatchSizeError(
            f"masked_tensor needs tensor0 and tensor1 of one shape [B, ...] and a mask [B]; got "
            f"{tuple(tensor0.shape)}, {tuple(tensor1.shape)} and mask {tuple(mask.shape)}"
        )
    m = mask if mask.dtype == torch.bool else mask != 0
    m = m.view((-1,) + (1,) * (tensor0.dim() - 1))
    return torch.where(m, tensor1.to(tensor0.dtype), tensor0)


def masked_dicttensor(dicttensor0: DictTensor, dicttensor1: DictTensor, mask: torch.Tensor) -> DictTensor:
    """:func:`masked_tensor` key by key, over the keys of ``dicttensor0``.

    Raises:
        KeyError: ``dicttensor1`` lacks a key of ``dicttensor0``.
        BatchSizeError: an argument is a record (0-d tensors, no rows to select).
    """
    for d in (dicttensor0, dicttensor1):
        if d.is_record():
            raise _record_error("masked_dicttensor", d)
    return _dt(
        {k: masked_tensor(v, dicttensor1[k], mask) for k, v in dicttensor0.variables.items()}
    )


# Registered as pytree nodes so that torch.utils._pytree.tree_map, torch.func and torch.compile see the tensors.
def _dt_flatten(d: DictTensor):
    return list(d.variables.values()), list(d.variables.keys())


def _dt_unflatten(values, keys) -> DictTensor:
    return _dt(dict(zip(keys, values)))


def _tdt_flatten(d: TemporalDictTensor):
    return [*d.variables.values(), d.lengths], list(d.variables.keys())


def _tdt_unflatten(values, keys) -> TemporalDictTensor:
    values = list(values)
    return _tdt(dict(zip(keys, values[:-1])), values[-1])


def _dt_flatten_with_keys(d: DictTensor):
    return [(pytree.MappingKey(k), v) for k, v in d.variables.items()], list(d.variables.keys())


def _tdt_flatten_with_keys(d: TemporalDictTensor):
    kv = [(pytree.MappingKey(k), v) for k, v in d.variables.items()]
    return kv + [(pytree.GetAttrKey("lengths"), d.lengths)], list(d.variables.keys())


pytree.register_pytree_node(
    DictTensor,
    _dt_flatten,
    _dt_unflatten,
    serialized_type_name="rlstruct.DictTensor",
    flatten_with_keys_fn=_dt_flatten_with_keys,
)
pytree.register_pytree_node(
    TemporalDictTensor,
    _tdt_flatten,
    _tdt_unflatten,
    serialized_type_name="rlstruct.TemporalDictTensor",
    flatten_with_keys_fn=_tdt_flatten_with_keys,
)
