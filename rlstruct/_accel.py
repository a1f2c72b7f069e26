"""The one seam between rlstruct's GPU logic and the accelerator's primitives: streams, events, graphs, compile mode.

The code that orders work on the device (the pipeline's streams and events, the captured acquisition's CUDA graph,
the compiled update's CUDA graphs) takes those primitives from an :class:`Accelerator` resolved once, when the
object is built, by :func:`accelerator_for` from the device's type: :data:`CUDA` on a CUDA device, ``None`` (no
streams, no graphs: the plain sequential path) elsewhere. Nothing on the per-step path resolves it again.

The indirection exists so that the ordering logic can run, and be checked, without a GPU: a test installs a
recording fake for the CPU with :func:`installed` and drives the very same code; the fake checks what a GPU would
only show as a rare race (which stream waited on which, whether a replay reads what was captured).

>>> accelerator_for("cpu") is None, accelerator_for("cuda:0") is CUDA
(True, True)
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from rlstruct.devices import DeviceLike, as_device

__all__ = ["Accelerator", "CudaAccelerator", "CUDA", "CHECK_GRAPH_INPUTS_ENV", "accelerator_for", "installed"]

log = logging.getLogger(__name__)

#: set (not ``0``) to have torch check at every replay of a CUDA graph captured here that each tensor the capture
#: read from outside the graph is still alive (``torch.cuda.graph(check_input_liveness=True)``, torch 2.13 on): a
#: replay through freed memory then raises, naming the tensor, instead of failing later as an unspecified launch
#: failure; for debugging (each replay checks on the host)
CHECK_GRAPH_INPUTS_ENV = "RLSTRUCT_CHECK_GRAPH_INPUTS"


class Accelerator(Protocol):
    """What the GPU logic asks of an accelerator. Streams and events follow ``torch.cuda.Stream``/``Event``:
    ``stream.wait_stream(other)``, ``stream.wait_event(event)``, ``event.record(stream)``, ``event.query()`` (done
    yet?), ``event.synchronize()`` (wait for it on the host); a graph has
    ``replay()``, ``reset()`` (release it and its memory pool) and, where the generators can be registered,
    ``register_generator_state(generator)``."""

    def current_stream(self, device: torch.device) -> Any:
        """The stream work is queued on now (the learner's, outside any :meth:`use_stream`)."""

    def new_stream(self, device: torch.device) -> Any:
        """A fresh stream on ``device``."""

    def use_stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Queues the work of the ``with`` body on ``stream``."""

    def new_event(self) -> Any:
        """A fresh event (record it on a stream, wait for it on another)."""

    def new_graph(self) -> Any:
        """An empty graph, for :meth:`capture`."""

    def capture(self, graph: Any, fn: Callable[[], Any]) -> None:
        """Records ``fn``'s device work into ``graph``; ``graph.replay()`` then repeats it on the same tensors."""

    def synchronize(self, device: torch.device) -> None:
        """Blocks the host until everything queued on ``device`` is done."""

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        """A page-locked host copy of ``t`` (a captured graph may read it by DMA)."""

    def compile_mode(self, backend: str) -> str | None:
        """The ``torch.compile`` mode of a compiled update with ``backend`` (``"reduce-overhead"``: CUDA graphs)."""

    def compile(self, fn: Callable[..., Any], *, mode: str | None, dynamic: bool | None,
                backend: str) -> Callable[..., Any]:
        """``torch.compile(fn, mode=mode, dynamic=dynamic, backend=backend)``."""

    def mark_step_begin(self) -> None:
        """Starts a new iteration of the compiled graphs: the previous replay's outputs may be overwritten."""

    def clear_blas_workspaces(self) -> None:
        """Drops the matrix library's cached workspaces (cuBLAS keeps one per stream, made at its first product
        there, and a graph capturing a product bakes in the one cached then): a capture that follows makes its own,
        in its graph's memory pool."""


class CudaAccelerator:
    """:class:`Accelerator` over ``torch.cuda``."""

    def current_stream(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.current_stream(device)

    def new_stream(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.Stream(device)

    def use_stream(self, stream: torch.cuda.Stream) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def new_event(self) -> torch.cuda.Event:
        return torch.cuda.Event()

    def new_graph(self) -> torch.cuda.CUDAGraph:
        return torch.cuda.CUDAGraph()

    def capture(self, graph: torch.cuda.CUDAGraph, fn: Callable[[], Any]) -> None:
        stream = torch.cuda.current_stream()
        try:
            with torch.cuda.graph(graph, **capture_options()):
                fn()
        finally:
            # A capture that fails leaves torch.cuda.graph's capture stream current (its exit raises before it
            # restores the stream): every later launch of this thread would go there.
            torch.cuda.set_stream(stream)

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        return t.pin_memory()

    def compile_mode(self, backend: str) -> str | None:
        # Only inductor turns the mode into CUDA graphs; another backend gets its default.
        return "reduce-overhead" if backend == "inductor" else None

    def compile(self, fn: Callable[..., Any], *, mode: str | None, dynamic: bool | None,
                backend: str) -> Callable[..., Any]:
        return torch.compile(fn, mode=mode, dynamic=dynamic, backend=backend)

    def mark_step_begin(self) -> None:
        torch.compiler.cudagraph_mark_step_begin()

    def clear_blas_workspaces(self) -> None:
        # What torch's CUDA graph trees call before and after each of their warm-ups and recordings.
        torch._C._cuda_clearCublasWorkspaces()

    def __repr__(self) -> str:
        return "CudaAccelerator()"


def capture_options() -> dict[str, Any]:
    """The keyword arguments of ``torch.cuda.graph`` for a capture: ``check_input_liveness=True`` where
    :data:`CHECK_GRAPH_INPUTS_ENV` asks for it and this torch has it (a warning where it does not)."""
    if os.environ.get(CHECK_GRAPH_INPUTS_ENV, "") in ("", "0"):
        return {}
    if "check_input_liveness" not in inspect.signature(torch.cuda.graph).parameters:
        log.warning("%s is set, but torch %s cannot check a CUDA graph's inputs (torch 2.13 can); capturing "
                    "without the check", CHECK_GRAPH_INPUTS_ENV, torch.__version__)
        return {}
    return {"check_input_liveness": True}


#: the accelerator of CUDA devices
CUDA = CudaAccelerator()

_BY_TYPE: dict[str, Accelerator] = {"cuda": CUDA}


def accelerator_for(device: DeviceLike) -> Accelerator | None:
    """The accelerator of ``device``'s type, or ``None`` where there is none (the sequential, uncaptured path).

    Call it once, when building the object that uses it, never per step.
    """
    return _BY_TYPE.get(as_device(device).type)


@contextlib.contextmanager
def installed(device_type: str, accelerator: Accelerator | None) -> Iterator[Accelerator | None]:
    """Within the ``with`` body, objects built for devices of ``device_type`` use ``accelerator`` (``None``: none);
    the previous one is restored on exit. For tests: a recording fake on ``"cpu"`` drives the GPU logic."""
    before = _BY_TYPE.get(device_type)
    if accelerator is None:
        _BY_TYPE.pop(device_type, None)
    else:
        _BY_TYPE[device_type] = accelerator
    try:
        yield accelerator
    finally:
        if before is None:
            _BY_TYPE.pop(device_type, None)
        else:
            _BY_TYPE[device_type] = before
