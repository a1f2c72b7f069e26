"""What RL_Batcher and RayBatcher share: argument checks, the call-order state machine, the validation of
agent_info/env_info rows (the one place they are checked), row splitting, and the optional imports of the
reports."""

from __future__ import annotations

import enum
import importlib
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from rlstruct._accel import accelerator_for
from rlstruct.batchers._buffer import Specs
from rlstruct.errors import (
    BatcherStateError,
    BatchSizeError,
    ConfigError,
    DeviceMismatchError,
    MissingDependencyError,
)
from rlstruct.seeding import check_seed
from rlstruct.structures import DictTensor


def check_cpu(d: DictTensor | None, name: str) -> DictTensor:
    """``d`` (or an empty DictTensor for ``None``), checked to be a DictTensor of rows (at least one, each tensor
    with a batch dimension) on the CPU."""
    if d is None:
        return DictTensor({})
    if not isinstance(d, DictTensor):
        raise TypeError(f"{name} must be a DictTensor, got {type(d).__name__}; wrap it with DictTensor({{...}})")
    dev = d.device()
    if dev is not None and dev.type != "cpu":
        raise DeviceMismatchError(f"{name} must be on the CPU, got {dev}; build {name} on the CPU (.to('cpu'))")
    for k, v in d.items():
        # A 0-d tensor has no row to repeat or split over the envs; 0 rows leave no example row for reset's default.
        if v.dim() == 0:
            raise BatchSizeError(
                f"{name} must hold rows [B, ...], but key {k!r} is 0-d (shape ()); give it a batch dimension, "
                f"e.g. {name}=DictTensor({{{k!r}: x.unsqueeze(0)}})"
            )
        if v.shape[0] == 0:
            raise BatchSizeError(
                f"{name} must hold at least one row, but key {k!r} has shape {tuple(v.shape)} (0 rows); pass one "
                f"example row (shape (1, ...)), or an empty DictTensor for no {name}"
            )
    return d


def check_graph_placements(placements: list, unit: str, fix: str) -> None:
    """Raises ValueError, naming the first one, when ``cuda_graph=True`` meets a ``unit`` (worker, actor) whose
    placement is not a CUDA device (one without an accelerator, :func:`rlstruct._accel.accelerator_for`); ``fix``
    says how to put them on a GPU."""
    off_gpu = [k for k, p in enumerate(placements) if accelerator_for(p.device) is None]
    if off_gpu:
        raise ValueError(
            f"cuda_graph=True needs every {unit} on a CUDA device, but {unit} {off_gpu[0]} runs on "
            f"{placements[off_gpu[0]].device}; {fix}, or cuda_graph=False"
        )


def check_restart_workers(restart_workers: Any) -> None:
    """Raises ValueError unless ``restart_workers`` is an int >= 0 (a bool is refused: True is not a count)."""
    if isinstance(restart_workers, bool) or not isinstance(restart_workers, int) or restart_workers < 0:
        raise ValueError(
            f"restart_workers must be an int >= 0 (how many failed workers may be replaced; 0 fails at the first), "
            f"got {restart_workers!r}; pass e.g. restart_workers=3"
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


def _seed_list(seeds: object, name: str, n_seeds: int, per: str) -> list:
    """``seeds`` as a list, or TypeError naming ``name`` when it is not a sequence of seeds."""
    message = (
        f"{name} must be a sequence of ints, one per {per} ({n_seeds}), got {type(seeds).__name__} {seeds!r}; "
        f"pass e.g. {name}={list(range(n_seeds))!r}"
    )
    # A str is iterable too, but never a list of seeds.
    if seeds is None or isinstance(seeds, (str, bytes)):
        raise TypeError(message)
    try:
        return list(seeds)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(message) from None


class Phase(enum.Enum):
    """Where a batcher is in its call order: ``reset`` -> ``execute`` -> ``get`` -> ``execute`` ..."""

    NEW = "new"  # built: reset() comes first
    READY = "ready"  # an execute() may start
    PENDING = "pending"  # an execute() awaits its get()
    FINISHED = "finished"  # every env finished its episode: reset() comes next
    FAILED = "failed"  # a worker or actor failed: only close() is left
    CLOSED = "closed"


class BatcherBase:
    """The call-order state machine, the argument checks and the row handling of a batcher whose envs are split
    over units (workers, actors).

    A subclass sets ``_name`` (its class name in messages), ``_unit`` (``"a worker"`` or ``"an actor"``) and
    ``_rows`` (how the number of envs is computed, for messages), and the attributes ``_specs``, ``_n_envs``,
    ``_offsets``, ``_default_agent_info`` and ``_default_env_info``. Its public methods call ``_enter(method)``
    first, and move the state with ``_to`` (and ``_fail`` when a unit failed).
    """

    _name: str
    _unit: str
    _rows: str
    _phase: Phase = Phase.NEW
    _failure = ""  # why the batcher failed (the first line of the error), in later messages
    _specs: Specs
    _n_envs: list[int]
    _offsets: list[int]
    _default_agent_info: DictTensor
    _default_env_info: DictTensor
    _timing_base: dict[str, float]

    def n_elems(self) -> int:
        raise NotImplementedError

    # ----------------------------------------------------------------- the state machine
    def _enter(self, method: str) -> None:
        """Raises BatcherStateError unless ``method`` (``"reset"``, ``"update"``, ``"execute"``, ``"get"``) may run
        now."""
        phase = self._phase
        if phase is Phase.CLOSED:
            raise BatcherStateError(f"{method}() called after close(); build a new {self._name}")
        if phase is Phase.FAILED:
            raise BatcherStateError(
                f"{method}() called after {self._failure}; the batcher failed: close() it and build a new one"
            )
        if method == "get":
            if phase is not Phase.PENDING:
                raise BatcherStateError("get() called with no execute() pending; call execute() first")
        elif method == "execute":
            if phase is Phase.NEW:
                raise BatcherStateError("execute() called before reset(); call reset() first")
            if phase is Phase.PENDING:
                raise BatcherStateError("execute() called while another execute() is pending; call get() first")
            if phase is Phase.FINISHED:
                raise BatcherStateError(
                    "execute() called but every env has finished its episode; call reset() to start new ones"
                )
        elif phase is Phase.PENDING:
            raise BatcherStateError(f"{method}() called while an execute() is pending; call get() first")

    def _to(self, phase: Phase) -> None:
        self._phase = phase

    def _got(self, n_running: int) -> None:
        """The move after a ``get`` that left ``n_running`` envs running."""
        self._phase = Phase.READY if n_running > 0 else Phase.FINISHED

    def _fail(self, e: BaseException, method: str = "") -> None:
        """Moves to FAILED because of ``e``, raised in ``method`` while talking to the units; later calls say why."""
        lines = str(e).splitlines()
        first = lines[0] if lines else ""
        if isinstance(e, Exception):
            self._failure = f"{self._unit} failed ({first or type(e).__name__})"
        else:
            # An interrupt (Ctrl-C, SystemExit) between a request and its replies leaves replies unread: the next
            # call would read the previous one's. Nothing can tell them apart, so the batcher is spent.
            self._failure = (
                f"{method or 'a call'}() was interrupted by {type(e).__name__}{': ' + first if first else ''} "
                "while it talked to the workers (their replies are out of step)"
            )
        self._phase = Phase.FAILED

    @contextmanager
    def _exchange(self, method: str) -> Iterator[None]:
        """Wraps a request to the units and the wait for their replies (or an in-process acquisition): whatever
        escapes it, a unit's failure or an interrupt, moves the batcher to FAILED and is re-raised unchanged."""
        try:
            yield
        except BaseException as e:
            self._fail(e, method)
            raise

    def _busy(self) -> bool:
        """Whether a unit may be busy (an acquisition pending) or hung (failed): ``close`` waits less for it."""
        return self._phase in (Phase.PENDING, Phase.FAILED)

    def _closing(self) -> bool:
        """Moves to CLOSED; ``False`` when it was closed already (``close`` is idempotent)."""
        if self._phase is Phase.CLOSED:
            return False
        self._phase = Phase.CLOSED
        return True

    # ----------------------------------------------------------------- argument checks
    @staticmethod
    def _check_args(n_timesteps: int, timeout: float, seeds: Sequence[int] | None,
                    agent_seeds: Sequence[int] | None, n_seeds: int, per: str, count: str, hint: str) -> list[int]:
        """Checks the arguments every batcher takes; returns ``seeds`` as a list of ints. ``n_seeds`` seeds are
        expected, one ``per`` unit (``count`` says how their number is computed, ``hint`` how they are used).

        Raises:
            TypeError: ``n_timesteps`` not an int (a bool included), ``timeout`` not a number, ``seeds`` or
                ``agent_seeds`` not a sequence.
            ValueError: ``n_timesteps < 1`` or ``timeout <= 0``.
            ConfigError: ``seeds`` or ``agent_seeds`` does not hold ``n_seeds`` seeds.
            SeedError: a seed is not an int in ``[0, 2**31)``.
        """
        # bool is an int subclass: True would pass as 1 and later fail far from here.
        if isinstance(n_timesteps, bool) or not isinstance(n_timesteps, int):
            raise TypeError(
                f"n_timesteps must be an int >= 1, got {type(n_timesteps).__name__} {n_timesteps!r}; pass e.g. "
                "n_timesteps=16"
            )
        if n_timesteps < 1:
            raise ValueError(f"n_timesteps must be an int >= 1, got {n_timesteps!r}; pass e.g. n_timesteps=16")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(
                f"timeout must be a number of seconds > 0, got {type(timeout).__name__} {timeout!r}; every wait on "
                "a worker has a limit, so pass e.g. timeout=120 (math.inf to wait forever)"
            )
        if math.isnan(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}; pass e.g. timeout=120")
        seeds = _seed_list(seeds, "seeds", n_seeds, per)
        if len(seeds) != n_seeds:
            raise ConfigError(
                f"seeds must hold one seed per {per}, {count} = {n_seeds}, got {len(seeds)} ({seeds!r}); {hint}"
            )
        if agent_seeds is not None:
            agent_seeds = _seed_list(agent_seeds, "agent_seeds", n_seeds, per)
            if len(agent_seeds) != n_seeds:
                raise ConfigError(
                    f"agent_seeds must hold one seed per {per} ({n_seeds}), got {len(agent_seeds)}; "
                    "or pass None"
                )
        for k, s in enumerate(seeds):
            check_seed(s, argument=f"seeds[{k}]")
        for k, s in enumerate(agent_seeds or []):
            check_seed(s, argument=f"agent_seeds[{k}]")
        return [int(s) for s in seeds]

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
