"""A recording accelerator for the CPU: drives the GPU logic (pipeline streams, captured acquisition, compiled update)
through :mod:`rlstruct._accel`'s seam and records what a GPU would only show as a rare race.

Ordering is tracked with vector clocks: every stream counts the operations queued on it, ``wait_stream`` and
``wait_event`` merge the clock of what is waited for, an event's ``record`` snapshots its stream's clock. An
operation ``a`` happens before ``b`` (on the device, whatever the host order) when ``b``'s clock has seen ``a``.
Work reaches the log through :meth:`RecordingAccelerator.op`, called on the stream that is current at that moment
(the test wraps the batcher's and the learner's calls in it). The CPU runs everything at once, so the results are
the sequential ones; only the recorded order tells whether the code would be correct on a GPU.

A graph records the callable it captures (without running it) and calls it again on every ``replay``, over the same
tensors: a CPU run with a captured acquisition gives the eager trajectories exactly when the replay reads the
statics that the code loaded.

A CUDA graph's replay reads and writes the addresses its capture saw, whatever the Python code has done since; the
CPU replay runs the Python again and would silently follow a rebound attribute. So the first replay (standing for the
capture) records, under a :class:`~torch.utils._python_dispatch.TorchDispatchMode`, every storage its ops touch that
existed before it began (:class:`Touched`: the op, where it was called, the address), and every later replay checks,
before it runs, that each is still alive at that address, and, while it runs, that it touches no storage from outside
the capture that the capture did not: what would be a replay through freed memory (or through a stale tensor) on a
GPU is an ``AssertionError`` here that names the op.

One buffer a CUDA graph touches is no tensor of the code's: the matrix library's workspace. torch keeps one cuBLAS
workspace per stream, made at the stream's first matrix product (inside a capture: in that graph's memory pool) and
held by a cache that torch's CUDA graph trees clear before and after each of their warm-ups and recordings; a graph
that captures a product bakes in the workspace the cache holds then, whoever made it. The fake keeps that cache
(:class:`BlasWorkspace`, for the captures' stream; its compiled functions clear it at their first two calls, as the
trees do) and a replay raises when its capture baked in a workspace made by another graph's: shared by two graphs,
and freed memory once that graph is released (:meth:`FakeGraph.reset`) and the cache cleared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _merge(into: dict[str, int], other: dict[str, int]) -> None:
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


@dataclasses.dataclass
class Op:
    """One operation queued on a stream: its label, the stream's name, and the vector clock it was queued at."""

    label: str
    stream: str
    clock: dict[str, int]

    def before(self, other: Op) -> bool:
        """Whether ``self`` is ordered before ``other`` on the device."""
        return self.clock[self.stream] <= other.clock.get(self.stream, 0)


class FakeStream:
    def __init__(self, accel: RecordingAccelerator, name: str):
        self.accel, self.name = accel, name
        self.clock: dict[str, int] = {name: 0}

    def wait_stream(self, other: FakeStream) -> None:
        _merge(self.clock, other.clock)
        self.accel.waits.append((self.name, other.name))

    def wait_event(self, event: FakeEvent) -> None:
        if event.clock is None:
            raise AssertionError(f"stream {self.name} waits on an event that was never recorded")
        _merge(self.clock, event.clock)
        self.accel.waits.append((self.name, f"event of {event.stream}"))

    def __repr__(self) -> str:
        return f"FakeStream({self.name!r})"


class FakeEvent:
    def __init__(self) -> None:
        self.clock: dict[str, int] | None = None
        self.stream: str | None = None

    def record(self, stream: FakeStream) -> None:
        self.clock, self.stream = dict(stream.clock), stream.name

    def query(self) -> bool:
        """Whether the work before the event is done: on the CPU, as soon as it is recorded."""
        return self.clock is not None

    def synchronize(self) -> None:
        if self.clock is None:
            raise AssertionError("the host waits on an event that was never recorded")


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, a wrapper subclass)
        return None


def live_storages() -> dict[int, StorageWeakRef]:
    """The storages of every tensor the garbage collector tracks, by ``_cdata``: what exists before a capture.

    Weak references, which keep each storage's bookkeeping (not its memory) alive: a storage made later cannot take
    the ``_cdata`` of one of these that dies meanwhile.
    """
    found = {}
    tensor_types: dict[type, bool] = {}  # issubclass once per type, not per object: there are hundreds of thousands
    for o in gc.get_objects():
        kind = type(o)  # type(), not isinstance: a lazy module's __class__ may warn
        is_tensor = tensor_types.get(kind)
        if is_tensor is None:
            is_tensor = tensor_types[kind] = issubclass(kind, torch.Tensor)
        if is_tensor:
            s = _storage(o)
            if s is not None and s._cdata not in found:
                found[s._cdata] = StorageWeakRef(s)
    return found


_TORCH_DIR = os.path.dirname(torch.__file__)


def _caller() -> str:
    """``file:line`` of the innermost frame outside torch and this module: the code that called the op."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(_TORCH_DIR) and frame.filename != __file__:
            return f"{os.path.relpath(frame.filename)}:{frame.lineno} ({frame.name})"
    return "?"


@dataclasses.dataclass
class Touched:
    """A storage from outside a capture that one of its ops read or wrote, first seen at op ``op`` called at
    ``where``, on a tensor described by ``what``, at address ``data_ptr``."""

    ref: StorageWeakRef
    data_ptr: int
    op: str
    where: str
    what: str

    def storage(self) -> torch.UntypedStorage | None:
        """The storage, or ``None`` once it has been freed."""
        if self.ref.expired():
            return None
        return torch.UntypedStorage._new_with_weak_ptr(self.ref.cdata)


#: the ops whose CUDA kernels are cuBLAS's, which take the stream's workspace
BLAS_OPS = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
                      "aten.mv.default", "aten.addmv.default", "aten._addmm_activation.default"})

#: the stream the captures run on (torch.cuda.graph's default capture stream, one for the process)
CAPTURE_STREAM = "capture"


@dataclasses.dataclass(eq=False)
class BlasWorkspace:
    """cuBLAS's workspace of one stream, as torch keeps it: made by the stream's first matrix product, in the memory
    pool of the graph capturing then (``owner``), and held by torch's cache until the cache is cleared."""

    stream: str
    owner: FakeGraph


class StorageRecorder(TorchDispatchMode):
    """Records the storages every op touches (arguments and results): those among ``before`` (storages that
    existed when the recording began) in :attr:`outside`, the others in :attr:`inside`; calls ``on_blas(op)`` after
    each matrix product (:data:`BLAS_OPS`)."""

    def __init__(self, before: dict[int, StorageWeakRef], on_blas: Callable[[Any], None] | None = None):
        super().__init__()
        self.before = before
        self.on_blas = on_blas
        self.outside: dict[int, Touched] = {}
        self.inside: dict[int, StorageWeakRef] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor):
                self._see(t, func)
        if self.on_blas is not None and str(func) in BLAS_OPS:
            self.on_blas(func)
        return out

    def _see(self, t: torch.Tensor, func: Any) -> None:
        s = _storage(t)
        if s is None:
            return
        key = s._cdata
        if key in self.outside or key in self.inside:
            return
        if key in self.before and not self.before[key].expired():
            self.outside[key] = Touched(StorageWeakRef(s), s.data_ptr(), str(func), _caller(),
                                        f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}")
        else:
            self.inside[key] = StorageWeakRef(s)


class FakeGraph:
    """Records the captured callable; ``replay`` calls it (the same tensors, as a CUDA graph's kernels), checking
    that it touches the storages its capture touched, alive at the same addresses (see the module's docstring).

    Attributes:
        touched: the storages from outside the capture that the capture read or wrote (``None`` before the first
            replay, which stands for the capture).
        made: the storages the capture made (in a CUDA graph, its private pool's: they live as long as the graph).
        workspaces: the matrix library's workspaces the capture baked in, each with the first op and call site.
        released: :meth:`reset` was called (a CUDA graph's memory pool is then given back).
    """

    def __init__(self, accel: RecordingAccelerator):
        self.accel = accel
        self.fn: Callable[[], Any] | None = None
        self.generators: list[torch.Generator] = []
        self.replays = 0
        self.touched: dict[int, Touched] | None = None
        self.made: dict[int, StorageWeakRef] = {}
        self.workspaces: dict[BlasWorkspace, tuple[str, str]] = {}
        self.released = False

    def register_generator_state(self, generator: torch.Generator) -> None:
        self.generators.append(generator)

    def reset(self) -> None:
        """Releases the graph (``torch.cuda.CUDAGraph.reset``): it cannot replay, and its memory pool is gone."""
        self.released, self.fn = True, None

    def _bake_workspace(self, func: Any) -> None:
        """A matrix product in the capture: the cache's workspace of the capture stream, made here if it holds none."""
        ws = self.accel.blas_workspaces.get(CAPTURE_STREAM)
        if ws is None:
            ws = self.accel.blas_workspaces[CAPTURE_STREAM] = BlasWorkspace(CAPTURE_STREAM, self)
        self.workspaces.setdefault(ws, (str(func), _caller()))

    def replay(self) -> None:
        if self.fn is None:
            raise AssertionError("replay() of a graph that captured nothing" + " (released)" * self.released)
        self.replays += 1
        self.accel.op("graph replay")
        if self.touched is not None:
            self._check_alive()
        capturing = self.touched is None
        recorder = StorageRecorder(live_storages(), self._bake_workspace if capturing else None)
        self.accel.capturing = True
        try:
            with recorder:
                self.fn()
        finally:
            self.accel.capturing = False
        if self.touched is None:
            self.touched, self.made = recorder.outside, recorder.inside
        else:
            self._check_same(recorder)

    def _check_alive(self) -> None:
        assert self.touched is not None
        held = list(self.accel.blas_workspaces.values())
        for ws, (op, where) in self.workspaces.items():
            if ws.owner is self:
                continue
            if ws.owner.released and not any(ws is h for h in held):
                what = ("that graph has been released and torch's cache of workspaces cleared since: a CUDA graph's "
                        "replay would write freed memory there")
            else:
                what = ("the two graphs share it: replays of theirs on two streams would write it at once, and once "
                        "that graph is released and the cache cleared, into freed memory")
            raise AssertionError(
                f"graph replay {self.replays}: the capture's {op} at {where} baked in the matrix library's "
                f"workspace of stream {ws.stream!r}, made by an earlier graph's capture in that graph's memory pool; "
                f"{what}; clear the workspaces before a capture (the graph then makes its own, in its pool) and "
                "after it"
            )
        for t in self.touched.values():
            s = t.storage()
            if s is None:
                raise AssertionError(
                    f"graph replay {self.replays}: the capture's {t.op} at {t.where} touched a {t.what} tensor that "
                    "has been freed since: a CUDA graph's replay would read or write freed memory there; keep the "
                    "tensor alive as long as the graph (copy new values into it in place, x.copy_(new), rather than "
                    "rebinding it), or capture again"
                )
            if s.data_ptr() != t.data_ptr:
                raise AssertionError(
                    f"graph replay {self.replays}: the capture's {t.op} at {t.where} touched a {t.what} tensor whose "
                    f"storage has moved since ({t.data_ptr:#x} -> {s.data_ptr():#x}, a resize_ or set_): a CUDA "
                    "graph's replay would touch the old address; keep the storage in place, or capture again"
                )

    def _check_same(self, recorder: StorageRecorder) -> None:
        assert self.touched is not None
        for key, t in recorder.outside.items():
            if key not in self.touched and key not in self.made:
                raise AssertionError(
                    f"graph replay {self.replays}: {t.op} at {t.where} touches a {t.what} tensor that the capture did "
                    "not: the code hands the captured step a tensor it made or rebound since, but a CUDA graph's "
                    "replay touches the captured one; update the captured tensor in place (x.copy_(new)), or capture "
                    "again"
                )


#: the ops after which the host waits for an accelerator: a read of a value (``.item()``, ``float()``, ``bool()``) and
#: an output whose size depends on the values
HOST_READ_OPS = frozenset({
    "aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.equal.default", "aten.nonzero.default",
    "aten.masked_select.default", "aten._unique2.default", "aten.unique_dim.default",
    "aten.unique_consecutive.default", "aten.repeat_interleave.Tensor",
})
#: the indexing ops that read a boolean index's values on the host (to count its true entries)
_MASK_INDEXING = frozenset({"aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default"})
#: the functions that make a tensor of host data, a blocking copy when given a ``device``
_FROM_HOST = (torch.tensor, torch.as_tensor)
#: the methods that read a tensor's values on the host without an op (none on the CPU)
_TO_HOST = (torch.Tensor.tolist, torch.Tensor.numpy)


class _ValueReads(TorchDispatchMode):
    def __init__(self, reads: list[tuple[str, str]]):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        masked = name in _MASK_INDEXING and any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in tree_leaves(args[1:2]))
        if name in HOST_READ_OPS or masked:
            self.reads.append((name, _caller()))
        return func(*args, **(kwargs or {}))


class _HostCalls(TorchFunctionMode):
    def __init__(self, reads: list[tuple[str, str]]):
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _FROM_HOST and (kwargs or {}).get("device") is not None:
            self.reads.append((f"torch.{func.__name__}(..., device=...)", _caller()))
        elif func in _TO_HOST:
            self.reads.append((f"Tensor.{func.__name__}", _caller()))
        return func(*args, **(kwargs or {}))


class HostReads:
    """Records, on the CPU, what would make the host wait for an accelerator's queue, with the code that called it:
    an op of :data:`HOST_READ_OPS`, a boolean index, ``tolist`` and ``numpy`` (which reach no op on the CPU), and
    ``torch.tensor`` or ``torch.as_tensor`` given a ``device`` (a blocking copy of host data onto it). On the CPU
    nothing waits; the record says what a GPU run of the same code would wait for. A ``.to(device)`` of a host
    tensor, no op on the CPU, is not seen; nor is a Python number written into a tensor (``x[i] = 0``), which
    reaches the device as a kernel's argument.

    Attributes:
        reads: ``(what, where)`` in host order, ``where`` the call site outside torch and this module.

    >>> with HostReads() as seen:
    ...     _ = torch.ones(3).sum().item()
    >>> [what for what, _ in seen.reads]
    ['aten._local_scalar_dense.default']
    """

    def __init__(self) -> None:
        self.reads: list[tuple[str, str]] = []
        self._modes = [_HostCalls(self.reads), _ValueReads(self.reads)]

    def __enter__(self) -> HostReads:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class RecordingAccelerator:
    """:class:`rlstruct._accel.Accelerator` for the CPU, recording streams, waits, graphs, syncs and compiles.

    Attributes:
        ops: every :meth:`op`, in host order.
        waits: ``(waiting stream, awaited stream or event)`` in host order.
        graphs: every graph made, in order.
        syncs: how many host synchronisations were asked for.
        compiles: ``(mode, backend)`` of every compile.
        step_marks: how many times a new iteration of the compiled graphs was marked.
        blas_workspaces: torch's cache of the matrix library's workspaces, by stream (see the module's docstring).
        blas_clears: how many times that cache was cleared.
        capturing: whether a graph's captured function is running (its capture, or a replay standing for one).
    """

    def __init__(self) -> None:
        self.default = FakeStream(self, "learner")
        self._current = self.default
        self.streams: list[FakeStream] = [self.default]
        self.ops: list[Op] = []
        self.waits: list[tuple[str, str]] = []
        self.graphs: list[FakeGraph] = []
        self.syncs = 0
        self.capturing = False
        self.compiles: list[tuple[str | None, str]] = []
        self.step_marks = 0
        self.blas_workspaces: dict[str, BlasWorkspace] = {}
        self.blas_clears = 0

    # --- the protocol
    def current_stream(self, device: torch.device) -> FakeStream:
        return self._current

    def new_stream(self, device: torch.device) -> FakeStream:
        s = FakeStream(self, f"side{len(self.streams)}")
        self.streams.append(s)
        return s

    @contextlib.contextmanager
    def use_stream(self, stream: FakeStream) -> Iterator[FakeStream]:
        before, self._current = self._current, stream
        try:
            yield stream
        finally:
            self._current = before

    def new_event(self) -> FakeEvent:
        return FakeEvent()

    def new_graph(self) -> FakeGraph:
        g = FakeGraph(self)
        self.graphs.append(g)
        return g

    def capture(self, graph: FakeGraph, fn: Callable[[], Any]) -> None:
        if graph.fn is not None:
            raise AssertionError("a graph captured twice")
        graph.fn = fn

    def synchronize(self, device: torch.device) -> None:
        self.syncs += 1
        # A host sync orders everything queued so far before what follows, on every stream.
        everything: dict[str, int] = {}
        for s in self.streams:
            _merge(everything, s.clock)
        for s in self.streams:
            _merge(s.clock, everything)

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        return t.clone()

    def compile_mode(self, backend: str) -> str | None:
        return "reduce-overhead"

    def compile(self, fn: Callable[..., Any], *, mode: str | None, dynamic: bool | None,
                backend: str) -> Callable[..., Any]:
        self.compiles.append((mode, backend))
        return GraphOutputs(self, fn)

    def mark_step_begin(self) -> None:
        self.step_marks += 1

    def clear_blas_workspaces(self) -> None:
        self.blas_clears += 1
        self.blas_workspaces.clear()

    # --- the recording
    def op(self, label: str) -> Op:
        """Queues an operation named ``label`` on the current stream and returns it."""
        s = self._current
        s.clock[s.name] += 1
        o = Op(label, s.name, dict(s.clock))
        self.ops.append(o)
        return o

    def find(self, label: str) -> Op:
        (o,) = [o for o in self.ops if o.label == label]
        return o


class GraphOutputs:
    """A compiled function as ``reduce-overhead`` runs it: its outputs live in graph memory that the next call
    overwrites, and a call not preceded by :meth:`RecordingAccelerator.mark_step_begin` while the previous outputs
    may still be read is refused (CUDA graph trees raise then). The loss keeps its autograd graph. Its first call
    (the trees' warm-up) and its second (their recording) clear torch's cache of the matrix library's workspaces, as
    the trees do."""

    def __init__(self, accel: RecordingAccelerator, fn: Callable[..., Any]):
        self.accel, self.fn = accel, fn
        self._marks = -1
        self._stats: dict[str, torch.Tensor] | None = None
        self.calls = 0

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self._stats is not None and self.accel.step_marks == self._marks:
            raise AssertionError("a reduce-overhead replay without cudagraph_mark_step_begin() since the last one")
        self._marks = self.accel.step_marks
        self.calls += 1
        if self.calls <= 2:
            self.accel.clear_blas_workspaces()
        loss, stats = self.fn(*inputs)
        if self._stats is None:
            self._stats = {k: torch.empty_like(v) for k, v in stats.items()}
        with torch.no_grad():
            for k, v in stats.items():
                self._stats[k].copy_(v)
        return loss, dict(self._stats)
