"""The learning regression check of the published table (``benchmarks/published.py --check``): the first minutes of
chosen rows run again and held to the band their recorded seeds give, so that a change which slows learning is
caught before a release, without the hours of a whole row.

A checked run is the row's own command (its preset at its whole budget, so that every schedule, a learning rate
annealed or an epsilon decayed over the budget, is the recorded runs'), interrupted (SIGINT: a checkpoint and a
summary, as Ctrl-C) once it has evaluated past the prefix. The prefix ends at ``--check-env-steps``, by default the
records' third evaluation.

The verdict compares areas under the curve over the prefix (:func:`rlstruct.algos.statistics.area_under_curve`: the
mean evaluation return over those env steps, so that learning later scores lower at the same final return). The
recorded seeds give the band ``[low, high]`` of their areas; a checked run passes at or above
``low - TOLERANCE * (high - low)``. A seed of the records run again on the same code gives the same curve (the same
seed gives the same run on any machine), so the band's lowest seed is a floor that the code that made the records
clears; a run above ``high`` passes and is said to be.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

#: how far under the recorded seeds' lowest area a checked run may fall, as a fraction of their spread
TOLERANCE = 0.25
#: the records' evaluation whose env steps end the prefix by default (the third: a curve, not a point)
DEFAULT_EVALUATIONS = 3


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A checked run against its row's records.

    Attributes:
        run: the checked run's name (``seed-S``).
        upto: the prefix's last env step.
        area: the checked run's area under the curve over the prefix (its mean evaluation return).
        low: the lowest recorded seed's area over the same env steps.
        high: the highest recorded seed's.
        floor: the least area that passes, ``low - TOLERANCE * (high - low)``.
    """

    run: str
    upto: float
    area: float
    low: float
    high: float
    floor: float

    @property
    def passed(self) -> bool:
        return self.area >= self.floor

    def line(self) -> str:
        where = "above the band" if self.area > self.high else "in the band" if self.area >= self.low else (
            "under the band, within the tolerance" if self.passed else "under the band")
        return (f"{self.run}: mean evaluation return {self.area:.2f} over the first {self.upto:,.0f} env steps, "
                f"{where} of the recorded seeds [{self.low:.2f}, {self.high:.2f}] (floor {self.floor:.2f}): "
                f"{'pass' if self.passed else 'FAIL'}")


def recorded_curves(records: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """The evaluation curves ``(env_steps, returns)`` of the finished runs in the records file ``records``, read
    (and checked) as ``rlstruct compare --reference`` reads them.

    Raises:
        RunRecordError: the file is not a records file, or a finished run's record is damaged.
    """
    from rlstruct.algos._train.records import load_reference

    return [(np.asarray(run.env_steps, dtype=np.float64), np.asarray(run.returns, dtype=np.float64))
            for run in load_reference(str(records)).infos if run.env_steps]


def default_prefix(curves: Sequence[tuple[np.ndarray, np.ndarray]], evaluations: int = DEFAULT_EVALUATIONS) -> float:
    """The env steps of the records' ``evaluations``-th evaluation (the shortest run's last, if it has fewer).

    >>> default_prefix([(np.array([0.0, 10.0, 20.0, 30.0]), np.zeros(4))])
    20.0
    """
    return float(min(steps[min(evaluations, steps.size) - 1] for steps, _ in curves))


def prefix_area(curve: tuple[Sequence[float], Sequence[float]], upto: float) -> float:
    """The area under ``curve`` from its first evaluation to ``upto`` env steps (linear between evaluations, the
    trapezoid rule): the mean evaluation return over the prefix.

    Raises:
        ValueError: the curve does not reach ``upto``.

    >>> prefix_area(([0, 10, 20, 30], [0.0, 10.0, 10.0, 99.0]), 20)
    7.5
    """
    from rlstruct.algos.statistics import align_runs, area_under_curve

    steps = np.asarray(curve[0], dtype=np.float64)
    if steps.size == 0 or steps[-1] < upto:
        raise ValueError(f"the curve must reach {upto:g} env steps, got one whose last evaluation is at "
                         f"{steps[-1] if steps.size else 0:g}")
    grid = np.union1d(steps[steps <= upto], [upto])
    return float(area_under_curve(grid, align_runs([curve], grid))[0])


def verdict(name: str, checked: tuple[Sequence[float], Sequence[float]],
            recorded: Sequence[tuple[Sequence[float], Sequence[float]]], upto: float) -> Verdict:
    """``checked``'s area over the prefix against the band of the ``recorded`` seeds' areas.

    >>> rec = [([0, 10, 20], [0.0, 4.0, 8.0]), ([0, 10, 20], [0.0, 6.0, 12.0])]
    >>> verdict("seed-0", ([0, 10, 20], [0.0, 5.0, 10.0]), rec, 20).passed
    True
    >>> verdict("seed-0", ([0, 10, 20], [0.0, 1.0, 2.0]), rec, 20).passed
    False
    """
    areas = [prefix_area(curve, upto) for curve in recorded]
    low, high = min(areas), max(areas)
    return Verdict(name, upto, prefix_area(checked, upto), low, high, low - TOLERANCE * (high - low))


def run_prefix(start: Callable[[], subprocess.Popen | None], folder: Path, upto: float, *,
               poll_s: float = 0.5, timeout_s: float = 7_200.0) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Runs the command ``start`` launches until ``folder``'s run has evaluated at ``upto`` env steps or past them,
    then interrupts it (SIGINT) and waits for its checkpoint and summary; returns the run's evaluations.

    Raises:
        RuntimeError: the run ended, or ran ``timeout_s``, before its evaluations reached ``upto``.
    """
    from rlstruct.algos._train.compare import read_evaluations

    proc = start()
    deadline = time.monotonic() + timeout_s
    try:
        while proc is not None and proc.poll() is None and time.monotonic() < deadline:
            steps, _ = read_evaluations(folder)
            if steps and steps[-1] >= upto:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=600)
                break
            time.sleep(poll_s)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc is not None and getattr(proc, "log", None) is not None:
            proc.log.close()
    steps, returns = read_evaluations(folder)
    if not steps or steps[-1] < upto:
        raise RuntimeError(f"{folder}: the run ended before evaluating at {upto:,.0f} env steps (its last evaluation: "
                           f"{steps[-1] if steps else 'none'}); see {folder.parent / (folder.name + '.log')}")
    return steps, returns
