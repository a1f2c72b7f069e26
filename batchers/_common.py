"""What RL_Batcher and RayBatcher share: argument checks, the call-order state machine, row splitting,
the Trajectories assembly, and the optional imports of the reports."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from rlstruct.errors import BatcherStateError, BatchSizeError, DeviceMismatchError, MissingDependencyError
from rlstruct.structures import DictTensor, TemporalDictTensor, Trajectories

from rlstruct.batchers._acquire import INFO_PREFIXES, TEMPORAL_PREFIXES, Specs


def check_cpu(d: DictTensor | None, name: str) -> DictTensor:
    """``d`` (or an empty DictTensor for ``None``), checked to be a DictTensor on the CPU."""
    if d is None:
        return DictTensor({})
    if not isinstance(d, DictTensor):
        raise TypeError(f"{name} must be a DictTensor, got {type(d).__name__}; wrap it with DictTensor({{...}})")
    dev = d.device()
    if dev is not None and dev.type != "cpu":
        raise DeviceMismatchError(f"{name} must be on the CPU, got {dev}; build {name} on the CPU (.to('cpu'))")
    return d


def check_graph_placements(placements: list, unit: str, fix: str) -> None:
    """Raises ValueError, naming the first one, when ``cuda_graph=True`` meets a ``unit`` (worker, actor) whose
    placement is not a CUDA device; ``fix`` says how to put them on a GPU."""
    off_gpu = [k for k, p in enumerate(placements) if p.device.type != "cuda"]
    if off_gpu:
        raise ValueError(
            f"cuda_graph=True needs every {unit} on a CUDA device, but {unit} {off_gpu[0]} runs on "
            f"{placements[off_gpu[0]].device}; {fix}, or cuda_graph=False"
        )


def repeat_first(d: DictTensor, n: int) -> DictTensor:
    """``n`` copies of the first row of ``d`` (``d`` itself when empty)."""
    if d.empty():
        return d
    return DictTensor._trusted({k: v[:1].expand((n,) + v.shape[1:]).clone() for k, v in d.items()})


def check_cpu_state_dict(state_dict: Any) -> None:
    """Raises DeviceMismatchError when a tensor of ``state_dict`` (given to ``update``) is not on the CPU."""
    if isinstance(state_dict, dict):
        for k, v in state_dict.items():
            if isinstance(v, torch.Tensor) and v.device.type != "cpu":
                raise DeviceMismatchError(
                    f"update() takes a CPU state dict, but {k!r} is on {v.device}; "
                    "send {k: v.cpu() for k, v in model.state_dict().items()}"
                )


def trajectories_from(data: dict[str, torch.Tensor]) -> Trajectories:
    """The Trajectories of a flat ``{key: tensor}`` of buffer keys (``lengths`` included; ``data`` loses it)."""
    lengths = data.pop("lengths")
    info = DictTensor._trusted({k: v for k, v in data.items() if k.startswith(INFO_PREFIXES)})
    traj = TemporalDictTensor._trusted({k: v for k, v in data.items() if k.startswith(TEMPORAL_PREFIXES)}, lengths)
    return Trajectories(info, traj)


def require(module: str, message: str) -> ModuleType:
    """``import module``, or MissingDependencyError(``message``) when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(message) from e


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the Agg backend (PNG files, no display)."""
    matplotlib = require(
        "matplotlib",
        "writing a PNG needs matplotlib, which is not installed; install it with `pip install 'rlstruct[plot]'`",
    )
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(plt: ModuleType, fig: Any, path: str | Path) -> Path:
    """Lays out ``fig``, writes it to ``path`` (100 dpi), closes it and returns ``Path(path)``."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


class BatcherBase:
    """The state machine and row handling of a batcher whose envs are split over ``units`` (workers, actors).

    A subclass sets ``_name`` (its class name in messages), ``_unit`` (``"a worker"`` or ``"an actor"``),
    ``_rows`` (how the number of envs is computed, for messages) and ``_idle`` (``_pending`` when nothing is
    pending), and the attributes ``_closed``, ``_failed``, ``_pending``, ``_specs``, ``_n_envs`` and
    ``_offsets``.
    """

    _name: str
    _unit: str
    _rows: str
    _idle: Any
    _closed: bool
    _failed: str | None
    _pending: Any
    _specs: Specs
    _n_envs: list[int]
    _offsets: list[int]
    _default_agent_info: DictTensor
    _default_env_info: DictTensor
    _timing_base: dict[str, float]

    def n_elems(self) -> int:
        raise NotImplementedError

    def _check_usable(self, method: str) -> None:
        if self._closed:
            raise BatcherStateError(f"{method}() called after close(); build a new {self._name}")
        if self._failed is not None:
            raise BatcherStateError(
                f"{method}() called after {self._unit} failed ({self._failed}); "
                "close() this batcher and build a new one"
            )

    def _check_idle(self, method: str) -> None:
        if self._pending is not self._idle:
            raise BatcherStateError(f"{method}() called while an execute() is pending; call get() first")

    def _fail(self, e: BaseException) -> None:
        self._failed = str(e).splitlines()[0]
        self._pending = self._idle

    def _check_rows(self, d: DictTensor, name: str, prefix: str) -> DictTensor:
        d = check_cpu(d, name)
        if d.empty():
            return d
        n = self.n_elems()
        if d.n_elems() != n:
            raise BatchSizeError(
                f"{name} must have one row per env, {self._rows} = {n}, got {d.n_elems()}; "
                "or pass an empty DictTensor"
            )
        expected = {k[len(prefix):]: v for k, v in self._specs.items() if k.startswith(prefix)}
        got = {k: (tuple(v.shape[1:]), v.dtype) for k, v in d.items()}
        if got != expected:
            raise ValueError(
                f"{name} must have the keys, row shapes and dtypes of the example given to {self._name}, "
                f"{expected}, got {got}; pass the same kind of {name} as at construction"
            )
        return d

    def _reset_rows(
        self, agent_info: DictTensor | None, env_info: DictTensor | None
    ) -> tuple[DictTensor, DictTensor]:
        """``reset``'s checked ``agent_info`` and ``env_info``, the constructor examples' first rows by default."""
        ai = self._check_rows(agent_info, "agent_info", "agent_info/") if agent_info is not None else DictTensor({})
        ei = self._check_rows(env_info, "env_info", "env_info/") if env_info is not None else DictTensor({})
        if ai.empty():
            ai = repeat_first(self._default_agent_info, self.n_elems())
        if ei.empty():
            ei = repeat_first(self._default_env_info, self.n_elems())
        return ai, ei

    def _split(self, d: DictTensor) -> list[DictTensor]:
        return [d.slice(o, o + n) for o, n in zip(self._offsets, self._n_envs)]

    def timings(self) -> dict[str, float]:
        raise NotImplementedError

    def reset_timings(self) -> None:
        """Restarts the :meth:`timings` counters from zero."""
        self._timing_base = {}
        self._timing_base = self.timings()

    def close(self) -> None:
        raise NotImplementedError

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
