"""TemporalDictTensor, named tensors over time with per-row lengths, and Trajectories, what a batcher returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from rlstruct.devices import DeviceLike, as_device
from rlstruct.errors import BatchSizeError, DeviceMismatchError
from rlstruct.structures._checks import Index, check_tensors, key_mismatch
from rlstruct.structures._dicttensor import DictTensor, new_dicttensor
from rlstruct.structures._per_key import NamedTensors, cat_keys

_object_new = object.__new__


def new_temporal(variables: dict[str, torch.Tensor], lengths: torch.Tensor) -> TemporalDictTensor:
    """A TemporalDictTensor without validation, for results of operations that keep the invariants (also
    ``TemporalDictTensor._trusted``)."""
    t = _object_new(TemporalDictTensor)
    t.variables = variables
    t.lengths = lengths
    return t


class TemporalDictTensor(NamedTensors):
    """A batch of ``B`` sequences of ``T`` steps: ``{key: Tensor[B, T, ...]}`` plus ``lengths: int64 [B]``.

    Row ``b`` holds ``lengths[b]`` valid steps; positions ``t >= lengths[b]`` are
    padding whose content is unspecified (use :meth:`mask`).

    Args:
        variables: the named tensors, each ``[B, T, ...]``.
        lengths: ``int64 [B]`` on the tensors' device; ``None`` means every row is full (length ``T``).

    Raises:
        ValueError: ``variables`` is empty, or a length (of CPU lengths) is outside ``[0, T]``.
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
        check_tensors(v, "TemporalDictTensor", 2)
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

    _trusted = staticmethod(new_temporal)

    def _with_keys(self, variables: dict[str, torch.Tensor]) -> TemporalDictTensor:
        # Built in place rather than through new_temporal: key renames cost about a microsecond, a call shows.
        t = _object_new(TemporalDictTensor)
        t.variables = variables
        t.lengths = self.lengths
        return t

    def _with_rows(self, variables: dict[str, torch.Tensor], rows: slice | torch.Tensor) -> TemporalDictTensor:
        return new_temporal(variables, self.lengths[rows])

    def _with_each(
        self, variables: dict[str, torch.Tensor], fn: Callable[[torch.Tensor], torch.Tensor]
    ) -> TemporalDictTensor:
        return new_temporal(variables, fn(self.lengths))

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
        return new_temporal({k: v[:, :m] for k, v in self.variables.items()}, self.lengths.clone())

    def temporal_slice(self, index_from: int, index_to: int) -> TemporalDictTensor:
        """Steps ``[index_from:index_to]`` of every row; lengths clamped to ``[0, index_to - index_from]``.

        Bounds past ``T`` are clipped to ``T``, as in Python slicing.

        Raises:
            ValueError: a bound is negative (counting from the end is ambiguous with padded rows).

        >>> t = TemporalDictTensor({"x": torch.arange(8).view(2, 4)}, torch.tensor([4, 2]))
        >>> s = t.temporal_slice(1, 3)
        >>> s["x"], s.lengths
        (tensor([[1, 2],
                [5, 6]]), tensor([2, 1]))
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
        return new_temporal({k: v[:, a:b] for k, v in self.variables.items()}, lengths)

    def temporal_index(self, t: int) -> DictTensor:
        """Step ``t`` of every row as a DictTensor ``[B, ...]`` (rows with ``t >= length`` give padding)."""
        return new_dicttensor({k: v[:, t] for k, v in self.variables.items()})

    def temporal_multi_index(self, index_t: torch.Tensor) -> DictTensor:
        """Step ``index_t[b]`` of each row ``b`` as a DictTensor ``[B, ...]``."""
        rows = torch.arange(self.n_elems(), device=self.device())
        index_t = index_t.to(self.device())
        return new_dicttensor({k: v[rows, index_t] for k, v in self.variables.items()})

    def masked_temporal_index(self, t: int) -> tuple[DictTensor, torch.Tensor]:
        """Step ``t`` of the rows with ``t < lengths[b]``, and those row indices (LongTensor)."""
        rows = torch.nonzero(self.lengths > t, as_tuple=False).squeeze(1)
        return new_dicttensor({k: v[rows, t] for k, v in self.variables.items()}), rows

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
        return new_temporal(v, torch.cat([self.lengths, self.lengths.new_zeros(n)]))

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
        return new_temporal(cat_keys("TemporalDictTensor.cat", tdts, T), torch.cat([d.lengths for d in tdts]))


class Trajectories:
    """``B`` trajectories: per-trajectory ``info`` (``DictTensor [B, ...]``) and their steps
    (``TemporalDictTensor [B, T, ...]``).

    Invariant: ``info`` is empty or has ``B`` rows on the trajectories' device.

    Raises:
        BatchSizeError: ``info`` does not have ``B`` rows.
        DeviceMismatchError: ``info`` is on another device.

    >>> steps = TemporalDictTensor({"reward": torch.ones(2, 3)}, torch.tensor([3, 1]))
    >>> t = Trajectories(DictTensor({"env_id": torch.tensor([4, 7])}), steps)
    >>> t.index(1).info["env_id"], t.index(1).trajectories.lengths
    (tensor([7]), tensor([1]))
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
        """Concatenates along the batch dimension (time zero-padded to the longest).

        Raises:
            ValueError: some infos have keys and others none, or as for :meth:`TemporalDictTensor.cat`.
        """
        infos = [t.info for t in trajectories]
        if any(i.variables for i in infos) and not all(i.variables for i in infos):
            raise key_mismatch("Trajectories.cat (info)", [i.variables for i in infos])
        return Trajectories(
            DictTensor.cat([t.info for t in trajectories]),
            TemporalDictTensor.cat([t.trajectories for t in trajectories]),
        )
