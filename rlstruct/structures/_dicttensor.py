"""DictTensor, a batch of named tensors, and the row-wise selects masked_tensor and masked_dicttensor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rlstruct.errors import BatchSizeError, MissingDependencyError
from rlstruct.structures._checks import check_tensors, fmt_keys, record_error
from rlstruct.structures._per_key import NamedTensors, cat_keys

_object_new = object.__new__


def new_dicttensor(variables: dict[str, torch.Tensor]) -> DictTensor:
    """A DictTensor over ``variables`` without validation, for results of operations that keep the invariants.

    It skips the checks, so that the container costs about one Python object over a plain dict; also
    ``DictTensor._trusted``, for the envs and batchers that build such results.
    """
    d = _object_new(DictTensor)
    d.variables = variables
    return d


class DictTensor(NamedTensors):
    """A batch of named tensors: ``{key: Tensor[B, ...]}``, all on one device.

    Invariant: every tensor has at least one dimension, the same first size
    ``B`` and the same device. A DictTensor with no key is *empty*
    (``empty()``), which is different from one with ``B == 0`` rows.

    A DictTensor whose tensors are all 0-d is a *record* (:meth:`is_record`): named
    scalars without a batch dimension, such as the losses an rlstructures program
    returns. What needs no rows works on it (``[]``, ``get``, ``clone``, ``detach``, ``to``,
    ``set`` of a 0-d tensor, the key renames, ``+`` with a record, printing, pytree); batch
    operations (``n_elems``, ``specs``, ``slice``, ``index``, ``unfold``, ``cat``, ``copy_``,
    ``masked_dicttensor``) raise :class:`~rlstruct.errors.BatchSizeError` saying so.

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
        check_tensors(v, "DictTensor", 1)
        self.variables: dict[str, torch.Tensor] = v

    _trusted = staticmethod(new_dicttensor)

    # A DictTensor has nothing beside its tensors: every hook wraps the new variables as they are.
    def _with_keys(self, variables: dict[str, torch.Tensor], _: Any = None) -> DictTensor:
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
                raise record_error("DictTensor.n_elems", self.variables) from None
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
        """The union of two DictTensors with disjoint keys (tensors shared).

        Raises:
            ValueError: the two share a key.
            BatchSizeError: their batch sizes differ, or one is a record and the other a batch.
            DeviceMismatchError: they are on different devices.

        >>> DictTensor({"x": torch.zeros(2)}) + DictTensor({"y": torch.ones(2)})
        DictTensor(B=2, device=cpu, {x: (2,) torch.float32, y: (2,) torch.float32})
        """
        if not isinstance(other, DictTensor):
            return NotImplemented
        if other.empty():
            return self
        if self.empty():
            return other
        common = [k for k in other.variables if k in self.variables]
        if common:
            raise ValueError(f"cannot add DictTensors that share keys {fmt_keys(common)}; rename one side")
        merged = {**self.variables, **other.variables}
        check_tensors(merged, "DictTensor", 1)
        return new_dicttensor(merged)

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
            return new_dicttensor({})
        for d in dicts:
            if d.is_record():
                raise BatchSizeError(
                    f"DictTensor.cat concatenates rows, but an element is a record of 0-d tensors (keys "
                    f"{fmt_keys(d.variables)}); stack records into a batch with "
                    "DictTensor({k: torch.stack([r[k] for r in records]) for k in records[0].keys()})"
                )
        if len(dicts) == 1:
            return dicts[0]
        return new_dicttensor(cat_keys("DictTensor.cat", dicts))

    # ----------------------------------------------------------- interop
    def to_tensordict(self) -> Any:
        """This DictTensor as a ``tensordict.TensorDict`` of batch size ``[B]`` (``[]`` for a record; tensors shared).

        Raises:
            MissingDependencyError: tensordict is not installed.
        """
        TensorDict = _import_tensordict()
        batch_size = [] if self.is_record() else [self.n_elems()]
        return TensorDict(dict(self.variables), batch_size=batch_size, device=self.device())

    @staticmethod
    def from_tensordict(td: Any) -> DictTensor:
        """A DictTensor from a ``tensordict.TensorDict`` (nested keys joined with ``/``).

        Raises:
            MissingDependencyError: tensordict is not installed.
        """
        _import_tensordict()
        flat = td.flatten_keys("/")
        return DictTensor({k: v for k, v in flat.items()})


def _import_tensordict() -> Any:
    try:
        from tensordict import TensorDict
    except ImportError as e:
        raise MissingDependencyError(
            "tensordict is not installed; install it with `pip install tensordict` to use "
            "to_tensordict/from_tensordict"
        ) from e
    return TensorDict


def masked_tensor(tensor0: torch.Tensor, tensor1: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Row-wise select: row ``b`` of ``tensor1`` where ``mask[b]`` is true, else of ``tensor0``.

    Works at any rank, keeps the dtype of ``tensor0`` (``tensor1`` is cast to it)
    and never blends values (a NaN in the unselected tensor does not leak).

    Args:
        tensor0: ``[B, ...]``.
        tensor1: ``[B, ...]``, same shape.
        mask: ``[B]`` of bool, or of numbers where non-zero means true.

    Raises:
        BatchSizeError: the shapes differ, or ``mask`` is not ``[B]``.

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

    >>> running = DictTensor({"x": torch.zeros(2, 1)})
    >>> masked_dicttensor(running, DictTensor({"x": torch.ones(2, 1)}), torch.tensor([False, True]))["x"]
    tensor([[0.],
            [1.]])
    """
    for d in (dicttensor0, dicttensor1):
        if d.is_record():
            raise record_error("masked_dicttensor", d.variables)
    return new_dicttensor({k: masked_tensor(v, dicttensor1[k], mask) for k, v in dicttensor0.variables.items()})
