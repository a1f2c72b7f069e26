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
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch


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


class FakeGraph:
    """Records the captured callable; ``replay`` calls it (the same tensors, as a CUDA graph's kernels)."""

    def __init__(self, accel: RecordingAccelerator):
        self.accel = accel
        self.fn: Callable[[], Any] | None = None
        self.generators: list[torch.Generator] = []
        self.replays = 0

    def register_generator_state(self, generator: torch.Generator) -> None:
        self.generators.append(generator)

    def replay(self) -> None:
        if self.fn is None:
            raise AssertionError("replay() of a graph that captured nothing")
        self.replays += 1
        self.accel.op("graph replay")
        self.fn()


class RecordingAccelerator:
    """:class:`rlstruct._accel.Accelerator` for the CPU, recording streams, waits, graphs, syncs and compiles.

    Attributes:
        ops: every :meth:`op`, in host order.
        waits: ``(waiting stream, awaited stream or event)`` in host order.
        graphs: every graph made, in order.
        syncs: how many host synchronisations were asked for.
        compiles: ``(mode, backend)`` of every compile.
        step_marks: how many times a new iteration of the compiled graphs was marked.
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
    may still be read is refused (CUDA graph trees raise then). The loss keeps its autograd graph."""

    def __init__(self, accel: RecordingAccelerator, fn: Callable[..., Any]):
        self.accel, self.fn = accel, fn
        self._marks = -1
        self._stats: dict[str, torch.Tensor] | None = None

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self._stats is not None and self.accel.step_marks == self._marks:
            raise AssertionError("a reduce-overhead replay without cudagraph_mark_step_begin() since the last one")
        self._marks = self.accel.step_marks
        loss, stats = self.fn(*inputs)
        if self._stats is None:
            self._stats = {k: torch.empty_like(v) for k, v in stats.items()}
        with torch.no_grad():
            for k, v in stats.items():
                self._stats[k].copy_(v)
        return loss, dict(self._stats)
