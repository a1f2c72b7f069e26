"""How a torch simulator runs its step kernels: four steppers behind one interface (``jit``, ``numpy``, ``torch``,
``compiled``; every one gives the same bits, up to the fused kernels' floating-point contractions), and the numpy
views of a CPU state that the host steppers share."""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlstruct.envs import _sim_kernels as kernels
from rlstruct.envs._array_ops import NumpyOps
from rlstruct.envs._sim_kernels import AutoresetOutputs, EpisodicOutputs, SimState

__all__ = ["KINDS", "HostViews", "Stepper", "TorchStepper", "CompiledStepper", "NumpyStepper", "JitStepper",
           "make_stepper", "fused"]

KINDS = ("jit", "numpy", "torch", "compiled")


def fused(step: Callable) -> Callable:
    """``step`` compiled whole by ``torch.compile`` for the shapes of its first call (``fullgraph=True``,
    ``dynamic=False``; compiled at that call): how every torch simulator fuses its auto-reset step.

    Inductor's default mode on every device: a step's kernels are element-wise and small reductions, with no matrix
    product for ``max-autotune`` to tune, and no CUDA graphs of its own (a batcher's ``cuda_graph`` captures the
    compiled kernels with the rest of its loop). Each simulator setting that changes the graph (the shapes, the
    constants the step reads) compiles once more, up to ``torch._dynamo.config.recompile_limit`` per process.
    """
    return torch.compile(step, fullgraph=True, dynamic=False)


class HostViews:
    """Numpy views of a CPU :class:`SimState`, ``rng_key`` as a ``uint32`` copy (what the host kernels take), kept
    while the state is the same value: up to ``10**4`` envs a CPU step costs its number of calls."""

    def __init__(self):
        self._pair: tuple[SimState, SimState] | None = None

    def clear(self) -> None:
        """Forgets the views (the state was replaced by tensors the views do not show)."""
        self._pair = None

    def of(self, state: SimState) -> SimState:
        """The views of ``state``."""
        pair = self._pair
        if pair is not None and pair[0] is state:
            return pair[1]
        if pair is not None and pair[0].rng_key is state.rng_key:
            key = pair[1].rng_key
        else:
            key = state.rng_key.numpy().astype(np.uint32)
        views = SimState(
            state.physics.numpy(), state.elapsed_steps.numpy(), state.episode.numpy(), key, state.last_action.numpy()
        )
        self._pair = (state, views)
        return views

    def adopt(self, views: SimState, last_action: torch.Tensor) -> SimState:
        """The state whose views are ``views``, the numpy state a host kernel returned for every env from the last
        :meth:`of` (tensors sharing its memory; ``last_action`` is already one). The fields the kernel passed
        through keep their tensors."""
        state, host = self._pair
        t = torch.from_numpy
        episode = state.episode if views.episode is host.episode else t(views.episode)
        new = SimState(t(views.physics), t(views.elapsed_steps), episode, state.rng_key, last_action)
        self._pair = (new, views)
        return new

    def rows(self, state: SimState, ids: torch.Tensor) -> SimState:
        """The rows ``ids`` of the views of ``state`` (copies)."""
        views, rows = self.of(state), ids.numpy()
        return SimState(
            views.physics[:, rows], views.elapsed_steps[rows], views.episode[rows], views.rng_key[rows],
            views.last_action[rows],
        )  # fmt: skip


class Stepper(abc.ABC):
    """One way of running a simulator's kernels: ``(state, action) -> (state, outputs)`` over the env's tensors.

    Attributes:
        kind: one of :data:`KINDS`.
        sparse_draws: whether fresh initial states are drawn for the finished envs only.
        writes_in_place: whether :meth:`step_into` writes the observations into given arrays.
        autoreset_kernel: the pure auto-reset kernel, bound to the simulator, on the stepper's arrays.
        episodic_kernel: the pure episodic kernel, likewise.
    """

    kind: str
    sparse_draws: bool = True
    writes_in_place: bool = False
    autoreset_kernel: Callable
    episodic_kernel: Callable

    @abc.abstractmethod
    def autoreset(self, state: SimState, a: torch.Tensor, a_host: np.ndarray | None
                  ) -> tuple[SimState, AutoresetOutputs]:
        """An auto-reset step of every env: the next state (its ``last_action`` the running observation's) and the
        outputs. ``a_host`` is the numpy view of ``a`` on the CPU, else ``None``."""

    def episodic(self, state: SimState, ids: torch.Tensor, a: torch.Tensor, a_host: np.ndarray | None
                 ) -> tuple[SimState, EpisodicOutputs]:
        """An episodic step of the envs ``ids`` (the running ones, ascending): the next state of every env (the
        others unchanged) and the outputs of the ``ids`` rows."""
        if ids.shape[0] == state.elapsed_steps.shape[0]:
            return self._episodic_all(state, a, a_host)
        physics, elapsed, out = self._episodic_rows(state, ids, a, a_host)
        return SimState(
            state.physics.index_copy(1, ids, physics),
            state.elapsed_steps.index_copy(0, ids, elapsed),
            state.episode,
            state.rng_key,
            state.last_action.index_copy(0, ids, a),
        ), out

    @abc.abstractmethod
    def _episodic_all(self, state: SimState, a: torch.Tensor, a_host: np.ndarray | None
                      ) -> tuple[SimState, EpisodicOutputs]:
        """:meth:`episodic` when every env runs."""

    @abc.abstractmethod
    def _episodic_rows(self, state: SimState, ids: torch.Tensor, a: torch.Tensor, a_host: np.ndarray | None
                       ) -> tuple[torch.Tensor, torch.Tensor, EpisodicOutputs]:
        """The next physics and elapsed steps of the rows ``ids``, and their outputs."""

    def step_into(self, state: SimState, a_host: np.ndarray, nxt: dict[str, np.ndarray],
                  run: dict[str, np.ndarray]) -> SimState:
        """An auto-reset step writing both observations into ``nxt`` and ``run``; returns the next state."""
        raise NotImplementedError(f"the {self.kind} stepper does not write in place")


def _rows(state: SimState, ids: torch.Tensor) -> SimState:
    """The rows ``ids`` of every field of ``state`` (copies)."""
    return SimState(
        state.physics.index_select(1, ids), state.elapsed_steps.index_select(0, ids),
        state.episode.index_select(0, ids), state.rng_key.index_select(0, ids), state.last_action.index_select(0, ids),
    )  # fmt: skip


class TorchStepper(Stepper):
    """The kernels on torch tensors, on any device; ``sparse``: draw for the finished envs only (one host sync)."""

    kind = "torch"

    def __init__(self, system: Any, *, sparse: bool = False):
        self.sparse_draws = sparse
        self.autoreset_kernel = functools.partial(
            kernels.autoreset_sparse if sparse else kernels.autoreset_dense, system
        )
        self.episodic_kernel = functools.partial(kernels.episodic, system)

    def autoreset(self, state, a, a_host):
        return self.autoreset_kernel(state, a)

    def _episodic_all(self, state, a, a_host):
        return self.episodic_kernel(state, a)

    def _episodic_rows(self, state, ids, a, a_host):
        nxt, out = self.episodic_kernel(_rows(state, ids), a)
        return nxt.physics, nxt.elapsed_steps, out


class CompiledStepper(TorchStepper):
    """The torch kernels fused by ``torch.compile`` (the first steps compile): the whole dense step, or with
    ``sparse`` the physics only, the draws of the finished envs outside."""

    kind = "compiled"

    def __init__(self, system: Any, *, sparse: bool = False):
        autoreset = (
            functools.partial(kernels.autoreset_sparse, advance=fused(kernels.advance))
            if sparse
            else fused(kernels.autoreset_dense)
        )
        self.sparse_draws = sparse
        self.autoreset_kernel = functools.partial(autoreset, system)
        # Envs leave an episodic batch as they finish: sizes symbolic from the first call, one graph for every count
        # (a static first graph would be followed by a dynamic one at the first finished env: two compiles)
        self.episodic_kernel = functools.partial(torch.compile(kernels.episodic, fullgraph=True, dynamic=True),
                                                 system)


class NumpyStepper(Stepper):
    """The kernels on numpy views of the CPU state (numpy's calls cost less than torch's at these sizes)."""

    kind = "numpy"

    def __init__(self, system: Any, host: HostViews):
        self.host = host
        self.autoreset_kernel = functools.partial(kernels.autoreset_numpy, system)
        self.episodic_kernel = functools.partial(kernels.episodic_numpy, system)

    def autoreset(self, state, a, a_host):
        nxt, out = self.autoreset_kernel(self.host.of(state), a_host)
        return self.host.adopt(nxt, torch.from_numpy(nxt.last_action)), out

    def _episodic_all(self, state, a, a_host):
        nxt, out = self.episodic_kernel(self.host.of(state), a_host)
        return self.host.adopt(nxt, a), out

    def _episodic_rows(self, state, ids, a, a_host):
        nxt, out = self.episodic_kernel(self.host.rows(state, ids), a_host)
        return torch.from_numpy(nxt.physics), torch.from_numpy(nxt.elapsed_steps), out


class JitStepper(NumpyStepper):
    """The CPU step in one compiled call, with the numpy kernels' bits; :meth:`step_into` has the compiled kernel
    write both observations where they go."""

    kind = "jit"
    writes_in_place = True

    def __init__(self, system: Any, host: HostViews, module: Any):
        self.host = host
        self.system = system
        draws = system._arrays(NumpyOps)
        self.compiled = kernels.CompiledKernels(
            autoreset=getattr(module, system._jit_name + "_autoreset"),
            episodic=getattr(module, system._jit_name + "_episodic"),
            constants=np.array([getattr(system, name) for name in system._jit_params], dtype=np.float64),
            draws=(draws.draw_salt.ravel(), draws.draw_scale.ravel(), draws.draw_offset.ravel()),
        )
        self.autoreset_kernel = functools.partial(kernels.autoreset_jit, system, self.compiled)
        self.episodic_kernel = functools.partial(kernels.episodic_jit, system, self.compiled)

    def step_into(self, state, a_host, nxt, run):
        new = kernels.autoreset_jit_into(
            self.system, self.compiled, self.host.of(state), a_host, nxt["frame"], run["frame"], nxt["reward"],
            run["reward"], nxt["done"], nxt["terminated"], nxt["truncated"], run["initial_state"],
            nxt["initial_state"], run["done"], run["terminated"], run["truncated"], run["last_action"],
        )  # fmt: skip
        nxt["last_action"][...] = a_host
        last = run["last_action"].copy()  # the env's own: the destination is overwritten later
        return self.host.adopt(
            SimState(new.physics, new.elapsed_steps, new.episode, new.rng_key, last), torch.from_numpy(last)
        )


def make_stepper(kind: str, system: Any, host: HostViews, *, sparse: bool = False, jit_module: Any = None) -> Stepper:
    """The stepper ``kind`` of :data:`KINDS` for the simulator ``system``; ``sparse`` applies to ``"torch"`` and
    ``"compiled"``, ``jit_module`` (the compiled kernels' module) to ``"jit"``."""
    if kind == "jit":
        return JitStepper(system, host, jit_module)
    if kind == "numpy":
        return NumpyStepper(system, host)
    if kind == "torch":
        return TorchStepper(system, sparse=sparse)
    return CompiledStepper(system, sparse=sparse)
