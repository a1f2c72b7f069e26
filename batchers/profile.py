"""Where the time of a collect + learn loop goes: :class:`PhaseTimer` times a learner's phases,
:class:`LoopTimer` a training loop's iterations with its batcher's timings, and :class:`ProfileReport` holds
seconds per phase (the collection's split out of :meth:`RL_Batcher.timings` by :func:`split_collection`) and
draws them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlstruct._plot import pyplot, save_png
from rlstruct.devices import DeviceLike, as_device

if TYPE_CHECKING:
    from rlstruct.batchers._base import BatcherBase

__all__ = ["PhaseTimer", "LoopTimer", "ProfileReport", "split_collection", "WORKER_PHASES", "LEARNER_PHASES",
           "COLLECT"]

log = logging.getLogger(__name__)

#: Collection phases measured in the batcher's workers (see :meth:`RL_Batcher.timings`).
WORKER_PHASES = ("env_step", "agent_forward", "buffer_write", "copy", "graph_replay")
#: The phase in which a training loop collects; it starts every iteration, and :func:`split_collection` splits it.
COLLECT = "collect"
#: Learner phases of the training loops (what :func:`rlstruct.algos.profile_training` reports), in loop order: the
#: trajectories to the learner's device, their normalisation (on-policy), their push into a replay buffer
#: (off-policy), the algorithm's learn step or gradient steps (loss, backward and optimizer steps), the weights to the
#: batcher, and the iteration's record (evaluation and checkpoint turns). A loop times the phases it has.
LEARNER_PHASES = ("to_learner", "normalize", "push", "learn", "update_weights", "record")


class PhaseTimer:
    """Accumulates wall-clock seconds per named phase, and the span from the first phase's start to the last one's
    end.

    With ``sync=True`` on a CUDA device it calls ``torch.cuda.synchronize`` when a phase starts and when it
    ends, and nowhere else: the GPU work queued inside a phase is charged to it, and the phase itself runs
    unsynchronized.

    Args:
        device: the device whose queued work belongs to the phases (only CUDA is synchronized).
        sync: synchronize at phase boundaries (ignored off CUDA).

    >>> timer = PhaseTimer()
    >>> with timer("loss"):
    ...     _ = sum(range(1000))
    >>> with timer("loss"):
    ...     pass
    >>> list(timer.seconds), timer.counts["loss"], timer.span >= timer.seconds["loss"]
    (['loss'], 2, True)
    """

    def __init__(self, device: DeviceLike = "cpu", *, sync: bool = True):
        self.device = as_device(device)
        self.sync = sync
        self._sync = sync and self.device.type == "cuda"
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self._first: float | None = None
        self._last = 0.0

    def _tick(self) -> float:
        if self._sync:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """A context manager that charges the time spent inside it to phase ``name``."""
        t0 = self._tick()
        if self._first is None:
            self._first = t0
        try:
            yield
        finally:
            self._last = self._tick()
            self.seconds[name] = self.seconds.get(name, 0.0) + self._last - t0
            self.counts[name] = self.counts.get(name, 0) + 1

    @property
    def span(self) -> float:
        """Seconds from the start of the first phase since the last :meth:`reset` to the end of the last one."""
        return 0.0 if self._first is None else self._last - self._first

    def reset(self) -> None:
        """Forgets every phase."""
        self.seconds.clear()
        self.counts.clear()
        self._first = None


class LoopTimer(PhaseTimer):
    """A :class:`PhaseTimer` for the iterations of a training loop, each of which starts with phase
    :data:`COLLECT`: it leaves the first ``warmup`` iterations out (allocator, lazy initialisations, compilation)
    and keeps the :meth:`RL_Batcher.timings` of those it counts, from the batcher the loop hands it (:meth:`watch`).

    Args:
        device: the learner's device (see :class:`PhaseTimer`).
        sync: synchronize a CUDA ``device`` at phase boundaries; the loop also asks its batcher for
            ``sync_timings`` by it.
        warmup: iterations not counted.

    >>> timer = LoopTimer(warmup=1)
    >>> for _ in range(3):
    ...     with timer(COLLECT):
    ...         pass
    ...     with timer("learn"):
    ...         pass
    >>> timer.iterations, timer.counts
    (2, {'collect': 2, 'learn': 2})
    """

    def __init__(self, device: DeviceLike = "cpu", *, sync: bool = True, warmup: int = 1):
        super().__init__(device, sync=sync)
        self.warmup = warmup
        self.iterations = 0
        self.batcher_timings: dict[str, float] = {}
        self._started = 0
        self._batcher: BatcherBase | None = None
        self._base: dict[str, float] = {}

    def watch(self, batcher: BatcherBase) -> None:
        """The training batcher whose timings the counted iterations report (the loop calls it once)."""
        self._batcher = batcher

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """:meth:`PhaseTimer.__call__`; phase :data:`COLLECT` starts an iteration."""
        if name == COLLECT:
            self._started += 1
            if self._started == self.warmup + 1:  # the first counted iteration
                self.reset()
                self._base = self._batcher.timings() if self._batcher is not None else {}
            if self._started > self.warmup:
                self.iterations += 1
        with super().__call__(name):
            yield
        if name == COLLECT and self._started > self.warmup and self._batcher is not None:
            self.batcher_timings = {k: v - self._base.get(k, 0.0) for k, v in self._batcher.timings().items()}

    def report(self, n_workers: int, config: dict[str, Any] | None = None) -> ProfileReport:
        """The counted iterations' :class:`ProfileReport`: the collection split by :func:`split_collection` over
        ``n_workers`` workers, the learner phases of :data:`LEARNER_PHASES`, and ``other`` (the rest of the span)."""
        bt = dict(self.batcher_timings)
        gather = bt.get("gather", 0.0)
        seconds = split_collection(bt, max(self.seconds.get(COLLECT, 0.0) - gather, 0.0), n_workers)
        seconds["gather"] = gather
        for k in LEARNER_PHASES:
            seconds[k] = self.seconds.get(k, 0.0)
        wall = self.span
        seconds["other"] = max(wall - sum(seconds.values()), 0.0)
        return ProfileReport(seconds, wall, int(bt.get("env_steps", 0)), self.iterations, bt, dict(config or {}))


# --------------------------------------------------------------------------- the report
@dataclass
class ProfileReport:
    """Seconds per phase of a profiled loop; they add up to ``wall_s``.

    Attributes:
        seconds: phase → seconds, in display order: the worker phases (``env_step``, ``agent_forward``,
            ``buffer_write``, ``copy``, ``graph_replay``: the replayed steps with ``cuda_graph``; averaged over
            workers, and scaled down to the collection time when workers overlap), ``wait`` (collection time
            not spent in the workers' step loop: IPC, imbalance, start of the acquisition), ``gather`` (copy out
            of the batcher's buffer), the learner phases
            (:data:`LEARNER_PHASES`: ``to_learner``, host–device copy of the trajectories, ``normalize``, ``push``,
            ``learn``, the algorithm's learn step, ``update_weights``, ``record``), then ``other``.
        wall_s: wall-clock seconds of the profiled iterations.
        env_steps: env transitions collected.
        iterations: collection + learning iterations profiled.
        batcher_timings: the raw :meth:`RL_Batcher.timings` (summed over workers).
        config: the arguments of the run.
    """

    seconds: dict[str, float]
    wall_s: float
    env_steps: int
    iterations: int
    batcher_timings: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def shares(self) -> dict[str, float]:
        """Phase → fraction of ``wall_s``."""
        total = sum(self.seconds.values()) or 1.0
        return {k: v / total for k, v in self.seconds.items()}

    @property
    def steps_per_s(self) -> float:
        """Env transitions per wall-clock second, learning included."""
        return self.env_steps / self.wall_s if self.wall_s > 0 else 0.0

    def table(self) -> str:
        """A plain-text table: phase, seconds, share."""
        lines = [f"{'phase':<16}{'seconds':>10}{'share':>8}"]
        for (k, v), s in zip(self.seconds.items(), self.shares().values()):
            lines.append(f"{k:<16}{v:>10.4f}{100 * s:>7.1f}%")
        lines.append(f"{'total':<16}{sum(self.seconds.values()):>10.4f}{100.0:>7.1f}%")
        lines.append(f"{self.env_steps} env steps in {self.wall_s:.3f} s: {self.steps_per_s:,.0f} steps/s "
                     "(learning included)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: seconds, shares, wall_s, env_steps, steps_per_s, iterations, config."""
        return {"seconds": dict(self.seconds), "shares": self.shares(), "wall_s": self.wall_s,
                "env_steps": self.env_steps, "steps_per_s": self.steps_per_s, "iterations": self.iterations,
                "config": dict(self.config)}

    def plot(self, path: str | Path) -> Path:
        """Writes a horizontal bar chart of the seconds per phase (PNG, matplotlib Agg).

        Raises:
            MissingDependencyError: matplotlib is not installed.
        """
        plt = pyplot()
        names = list(self.seconds)[::-1]
        fig, ax = plt.subplots(figsize=(7, 0.35 * len(names) + 1.2))
        bars = ax.barh(names, [self.seconds[k] for k in names], color="tab:blue")
        shares = self.shares()
        for bar, k in zip(bars, names):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {100 * shares[k]:.1f}%", va="center")
        ax.set_xlabel("seconds")
        ax.set_title(f"where the time goes ({self.steps_per_s:,.0f} env steps/s, learning included)")
        ax.margins(x=0.15)
        return save_png(plt, fig, path)


def split_collection(timings: dict[str, float], collect_s: float, n_workers: int) -> dict[str, float]:
    """Attributes ``collect_s`` seconds of driver time to the worker phases and ``wait``.

    The worker phases are averaged over workers (they run side by side); if they exceed ``collect_s``
    (a worker collected while the driver did something else), they are scaled down to it, and ``wait``
    is what remains.

    >>> split_collection({"env_step": 4.0, "agent_forward": 2.0, "buffer_write": 0.0, "copy": 0.0}, 4.0, 2)
    {'env_step': 2.0, 'agent_forward': 1.0, 'buffer_write': 0.0, 'copy': 0.0, 'graph_replay': 0.0, 'wait': 1.0}
    """
    per = {k: timings.get(k, 0.0) / max(n_workers, 1) for k in WORKER_PHASES}
    busy = sum(per.values())
    scale = min(1.0, collect_s / busy) if busy > 0 else 1.0
    out = {k: v * scale for k, v in per.items()}
    out["wait"] = max(collect_s - busy * scale, 0.0)
    return out
