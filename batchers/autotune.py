"""How many envs per process, and how many processes (or GPU instances)? Answered by measurement.

:func:`autotune` sweeps the env count per process by doubling (``min_envs``, ``2 * min_envs``, …,
``max_envs``) for each process count, measuring steps/s and memory. A sweep stops at *saturation*, when
doubling the envs buys less throughput per unit of extra memory than ``min_gain_per_memory``, and a
configuration whose projected memory does not fit the available host (or GPU) memory is skipped without
being built. The result holds the best configuration and the whole table.

The measurement is injectable: ``measure(n_processes, n_envs) -> Measurement``. The one ``rlstruct autotune``
uses, :func:`rlstruct.algos._train.profile.batcher_measure`, times an :class:`~rlstruct.batchers.RL_Batcher` of the
algorithms' policy agent on a :func:`~rlstruct.envs.make_env` env.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

from rlstruct.batchers._common import pyplot, save_png
from rlstruct.devices import DeviceLike, check_device_exists

__all__ = ["Measurement", "TuneRow", "AutotuneResult", "autotune", "host_rss", "available_gpu_bytes"]

log = logging.getLogger(__name__)

GIB = 2**30
MIB = 2**20


@dataclass
class Measurement:
    """What one configuration achieved.

    Attributes:
        steps_per_s: env transitions per second.
        host_bytes: host memory of the configuration (RSS of this process and its children, less this
            process's RSS before the configuration was built).
        gpu_bytes: GPU memory of the configuration, or ``None`` on the CPU.
    """

    steps_per_s: float
    host_bytes: int
    gpu_bytes: int | None = None


@dataclass
class TuneRow:
    """One configuration of the sweep.

    Attributes:
        n_processes: worker processes (or GPU instances); 0 is the calling process.
        n_envs: envs per process.
        status: ``"measured"``, ``"skipped"`` (projected memory does not fit) or ``"failed"`` (the
            measurement raised; the message is in ``note``).
        steps_per_s: measured throughput (``None`` unless measured).
        host_bytes: measured (or, when skipped, projected) host memory.
        gpu_bytes: measured (or projected) GPU memory, ``None`` on the CPU.
        gain: throughput gain per unit of extra memory against the previous row of the sweep (relative
            steps/s gain over relative memory growth), ``None`` for the first.
        note: why the sweep stopped here, or why the row was skipped.
    """

    n_processes: int
    n_envs: int
    status: str
    steps_per_s: float | None = None
    host_bytes: int | None = None
    gpu_bytes: int | None = None
    gain: float | None = None
    note: str = ""

    @property
    def total_envs(self) -> int:
        """Envs over every process."""
        return max(self.n_processes, 1) * self.n_envs


@dataclass
class AutotuneResult:
    """The best configuration and every row of the sweep.

    Attributes:
        best: the measured row with the highest steps/s (the smaller memory on a tie).
        rows: every configuration tried, in sweep order.
        host_budget: host bytes a configuration could use.
        gpu_budget: GPU bytes a configuration could use (``None`` on the CPU).
    """

    best: TuneRow
    rows: list[TuneRow]
    host_budget: int
    gpu_budget: int | None = None
    config: dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        """A plain-text table of every row, the best one marked with ``*``."""
        head = (f"  {'procs':>5} {'envs/proc':>9} {'total':>8} {'steps/s':>12} {'host MiB':>9} {'GPU MiB':>8} "
                f"{'gain':>6}  status")
        lines = [head]
        for r in self.rows:
            mark = "*" if r is self.best else " "
            sps = f"{r.steps_per_s:,.0f}" if r.steps_per_s is not None else "-"
            host = f"{r.host_bytes / MIB:.0f}" if r.host_bytes is not None else "-"
            gpu = f"{r.gpu_bytes / MIB:.0f}" if r.gpu_bytes is not None else "-"
            gain = f"{r.gain:.2f}" if r.gain is not None else "-"
            status = r.status + (f": {r.note}" if r.note else "")
            lines.append(f"{mark} {r.n_processes:>5} {r.n_envs:>9} {r.total_envs:>8} {sps:>12} {host:>9} {gpu:>8} "
                         f"{gain:>6}  {status}")
        b = self.best
        lines.append(f"best: n_processes={b.n_processes}, n_envs={b.n_envs} per process ({b.total_envs} envs), "
                     f"{b.steps_per_s:,.0f} steps/s")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: best, rows, budgets, config."""
        return {"best": asdict(self.best), "rows": [asdict(r) for r in self.rows], "host_budget": self.host_budget,
                "gpu_budget": self.gpu_budget, "config": dict(self.config)}

    def plot(self, path: str | Path) -> Path:
        """Writes steps/s against total env count, one line per process count (PNG, log2 x axis).

        Raises:
            MissingDependencyError: matplotlib is not installed.
        """
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for p in sorted({r.n_processes for r in self.rows}):
            rows = [r for r in self.rows if r.n_processes == p and r.status == "measured"]
            if rows:
                ax.plot([r.total_envs for r in rows], [r.steps_per_s for r in rows], marker="o",
                        label=f"{p} process{'es' if p != 1 else ''}" if p else "in process")
        b = self.best
        ax.scatter([b.total_envs], [b.steps_per_s], s=160, facecolors="none", edgecolors="red", label="best", zorder=3)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("envs (all processes)")
        ax.set_ylabel("env steps / s")
        ax.set_title("autotune: throughput against env count")
        ax.grid(True, alpha=0.3)
        ax.legend()
        return save_png(plt, fig, path)


# --------------------------------------------------------------------------- memory
def host_rss(pid: int | None = None) -> int:
    """Resident bytes of process ``pid`` (default: this one) and all its descendants.

    Shared-memory buffers count once per process that maps them, so this errs on the high side.
    """
    proc = psutil.Process(pid if pid is not None else os.getpid())
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def _available_host_bytes() -> int:
    return int(psutil.virtual_memory().available)


def available_gpu_bytes(device: torch.device) -> int:
    """Free bytes on CUDA ``device``, as the driver reports them (every process's allocations count)."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


# --------------------------------------------------------------------------- the search
def _memory(m: Measurement | TuneRow) -> float:
    """The memory that saturation is judged on: GPU bytes where there are some, else host bytes."""
    gpu = m.gpu_bytes
    return float(gpu if gpu is not None else (m.host_bytes or 0))


def _project(prev: list[TuneRow], n_envs: int, attr: str) -> float | None:
    """Memory of ``n_envs`` from the sweep so far: a line through the last two rows, or the last scaled by
    ``n_envs`` (an upper bound for memory affine in the env count) when there is one."""
    pts = [(r.n_envs, getattr(r, attr)) for r in prev if r.status == "measured" and getattr(r, attr) is not None]
    if not pts:
        return None
    if len(pts) == 1:
        n0, m0 = pts[-1]
        return m0 * n_envs / n0
    (n0, m0), (n1, m1) = pts[-2], pts[-1]
    slope = max((m1 - m0) / (n1 - n0), 0.0)
    return max(m1 + slope * (n_envs - n1), m1)


def autotune(
    measure: Callable[[int, int], Measurement],
    *,
    process_counts: Sequence[int] = (1, 2),
    min_envs: int = 128,
    max_envs: int = 2**14,
    min_gain_per_memory: float = 0.1,
    min_memory_growth: float = 0.5,
    host_budget: int | None = None,
    gpu_budget: int | None = None,
    memory_fraction: float = 0.8,
    device: DeviceLike = "cpu",
    config: dict[str, Any] | None = None,
) -> AutotuneResult:
    """Finds the env count per process and the process count with the highest steps/s that fits.

    For each process count ``p``, ``n_envs`` doubles from ``min_envs`` to ``max_envs``:

    * **Memory skip.** Before building ``(p, n_envs)``, its memory is projected from the sweep's previous rows
      (a line through the last two, or twice the last); if it exceeds the budget, the row is recorded as
      ``skipped`` and the sweep stops (more envs need more). The first row of a sweep is projected from the
      previous sweep's first row, scaled by the process count.
    * **Saturation.** After measuring, ``gain = (relative steps/s gain) / max(relative memory growth,
      min_memory_growth)`` against the previous row; below ``min_gain_per_memory`` the sweep stops. The
      floor on memory growth keeps noise-level speedups from counting when the memory hardly grows (on a
      CPU, most of a process's memory is torch itself).
    * A measurement that raises (e.g. out of memory) is recorded as ``failed`` and stops the sweep.

    Args:
        measure: ``measure(n_processes, n_envs) -> Measurement`` (e.g. the one ``rlstruct autotune`` uses).
        process_counts: process counts to sweep (0: the calling process).
        min_envs: first env count per process.
        max_envs: largest env count per process.
        min_gain_per_memory: saturation threshold (0 disables the saturation stop).
        min_memory_growth: floor of the relative memory growth in ``gain``.
        host_budget: host bytes a configuration may use (default: ``memory_fraction`` of the available
            memory now).
        gpu_budget: GPU bytes (default on CUDA: ``memory_fraction`` of the free device memory now).
        memory_fraction: share of the available memory used as the default budgets.
        device: the device the measurements run on (for the default GPU budget).
        config: recorded in the result (e.g. the env and measurement settings).

    Returns:
        An :class:`AutotuneResult`.

    Raises:
        ValueError: bad sweep bounds or thresholds, or no configuration could be measured.

    >>> fake = lambda p, n: Measurement(steps_per_s=min(n, 512) * max(p, 1) * 1000.0, host_bytes=n * p * 2**20)
    >>> result = autotune(fake, process_counts=(1, 2), min_envs=128, max_envs=4096, host_budget=2**40)
    >>> (result.best.n_processes, result.best.n_envs)
    (2, 512)
    >>> [r.n_envs for r in result.rows if r.n_processes == 1]
    [128, 256, 512, 1024]
    """
    if not isinstance(min_envs, int) or min_envs < 1:
        raise ValueError(f"min_envs must be an int >= 1, got {min_envs!r}")
    if not isinstance(max_envs, int) or max_envs < min_envs:
        raise ValueError(f"max_envs must be an int >= min_envs ({min_envs}), got {max_envs!r}")
    counts = list(process_counts)
    if not counts or any(not isinstance(p, int) or p < 0 for p in counts):
        raise ValueError(f"process_counts must be a non-empty list of ints >= 0, got {process_counts!r}")
    if min_gain_per_memory < 0:
        raise ValueError(
            f"min_gain_per_memory must be >= 0 (0 disables the saturation stop), got {min_gain_per_memory!r}"
        )
    if not 0 < min_memory_growth:
        raise ValueError(f"min_memory_growth must be > 0, got {min_memory_growth!r}")
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
    dev = check_device_exists(device)
    if host_budget is None:
        host_budget = int(memory_fraction * _available_host_bytes())
    if gpu_budget is None and dev.type == "cuda":
        gpu_budget = int(memory_fraction * available_gpu_bytes(dev))

    rows: list[TuneRow] = []
    first_rows: list[TuneRow] = []
    for p in counts:
        sweep: list[TuneRow] = []
        n = min_envs
        while n <= max_envs:
            if sweep:
                host_proj, gpu_proj = _project(sweep, n, "host_bytes"), _project(sweep, n, "gpu_bytes")
            elif first_rows:
                ref = first_rows[-1]
                scale = max(p, 1) / max(ref.n_processes, 1) * n / ref.n_envs
                host_proj = None if ref.host_bytes is None else ref.host_bytes * scale
                gpu_proj = None if ref.gpu_bytes is None else ref.gpu_bytes * scale
            else:
                host_proj = gpu_proj = None
            over = []
            if host_proj is not None and host_proj > host_budget:
                over.append(f"projected host memory {host_proj / GIB:.2f} GiB > budget {host_budget / GIB:.2f} GiB")
            if gpu_proj is not None and gpu_budget is not None and gpu_proj > gpu_budget:
                over.append(f"projected GPU memory {gpu_proj / GIB:.2f} GiB > budget {gpu_budget / GIB:.2f} GiB")
            if over:
                rows.append(TuneRow(p, n, "skipped", host_bytes=None if host_proj is None else int(host_proj),
                                    gpu_bytes=None if gpu_proj is None else int(gpu_proj), note="; ".join(over)))
                log.info("autotune: skip p=%d n_envs=%d (%s)", p, n, rows[-1].note)
                break
            try:
                m = measure(p, n)
            except Exception as e:  # an OOM or a crash ends this sweep, not the search
                first_line = str(e).splitlines()[0] if str(e) else ""
                rows.append(TuneRow(p, n, "failed", note=f"{type(e).__name__}: {first_line}"))
                log.warning("autotune: p=%d n_envs=%d failed: %s", p, n, rows[-1].note)
                break
            row = TuneRow(p, n, "measured", m.steps_per_s, m.host_bytes, m.gpu_bytes)
            log.info("autotune: p=%d n_envs=%d: %.0f steps/s", p, n, m.steps_per_s)
            stop = False
            if sweep:
                prev = sweep[-1]
                speedup = m.steps_per_s / prev.steps_per_s - 1 if prev.steps_per_s else float("inf")
                mem_prev = _memory(prev)
                # A configuration measured at ~0 bytes (noise) must not make the next growth look infinite.
                growth = (_memory(m) - mem_prev) / max(mem_prev, MIB)
                row.gain = speedup / max(growth, min_memory_growth)
                if row.gain < min_gain_per_memory:
                    row.note = (f"saturated: {100 * speedup:+.1f}% steps/s for {100 * growth:+.1f}% memory "
                                f"(gain {row.gain:.2f} < {min_gain_per_memory})")
                    stop = True
            else:
                first_rows.append(row)
            sweep.append(row)
            rows.append(row)
            if stop:
                break
            n *= 2
    measured = [r for r in rows if r.status == "measured"]
    if not measured:
        raise ValueError(
            f"no configuration could be measured (every one was skipped or failed): {[r.note for r in rows]}; "
            "lower min_envs, raise host_budget/gpu_budget, or look at the failures"
        )
    best = max(measured, key=lambda r: (r.steps_per_s, -_memory(r)))
    return AutotuneResult(best, rows, int(host_budget), None if gpu_budget is None else int(gpu_budget),
                          dict(config or {}))
