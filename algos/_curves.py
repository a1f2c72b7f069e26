"""Learning curves over seeds (re-exported by :mod:`rlstruct.algos.statistics`), as Agarwal et al. (2021) draw sample
efficiency: each run's evaluation returns against env steps put on one grid (:func:`common_grid`,
:func:`align_runs`), from which :func:`~rlstruct.algos.statistics.curve_intervals` gives an aggregate of the runs at
each step with its stratified bootstrap interval, and the area under a run's curve as one score
(:func:`area_under_curve`), whose IQM over seeds :func:`~rlstruct.algos.statistics.aggregate_scores` gives.

A run's curve is ``(env_steps, returns)``, two equal-length sequences, env steps increasing. The runs of several
tasks (envs) are given as ``{task: float64 [runs, steps]}`` on one grid and resampled task by task, as the final
scores are. Needs scipy (``pip install 'rlstruct[stats]'``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np

__all__ = ["CurveEstimate", "Curves", "align_runs", "area_under_curve", "common_grid"]

#: one run's curve: its evaluations' env steps and returns
RunCurve = tuple[Sequence[float], Sequence[float]]
#: the aligned curves of one group: ``float64 [runs, steps]``, or task name -> its runs' curves
Curves = Union[np.ndarray, Mapping[str, np.ndarray]]


def _checked(run: RunCurve, index: int) -> tuple[np.ndarray, np.ndarray]:
    steps, values = (np.asarray(v, dtype=np.float64) for v in run)
    if steps.ndim != 1 or steps.shape != values.shape or steps.size == 0:
        raise ValueError(f"run {index}'s curve must be two flat sequences of one length >= 1 (env steps, returns), "
                         f"got shapes {steps.shape} and {values.shape}")
    if not (np.isfinite(steps).all() and np.isfinite(values).all()):
        raise ValueError(f"run {index}'s curve must be finite, got env steps {steps.tolist()} and returns "
                         f"{values.tolist()}; leave out the runs that did not finish")
    if (np.diff(steps) < 0).any():
        raise ValueError(f"run {index}'s env steps must not decrease, got {steps.tolist()}; pass its evaluation "
                         "rows in the order the run wrote them")
    return steps, values


def common_grid(runs: Sequence[RunCurve], *, points: int | None = None) -> tuple[np.ndarray, bool]:
    """The env steps at which every run of ``runs`` is read: ``(grid, interpolated)``.

    Runs evaluated at the same env steps keep them (``interpolated`` False). Otherwise the grid spans the steps that
    every run covers, from the latest first evaluation to the earliest last one, in ``points`` evenly spaced steps
    (default: the most evaluations a run holds), and each run is interpolated linearly onto it (``interpolated``
    True): no run is extrapolated past what it evaluated.

    Raises:
        ValueError: no run, a curve that is empty, not finite or whose env steps decrease.

    >>> common_grid([([0, 10, 20], [1, 2, 3]), ([0, 10, 20], [0, 0, 1])])
    (array([ 0., 10., 20.]), False)
    >>> common_grid([([0, 10, 20], [1, 2, 3]), ([5, 15, 30], [0, 0, 1])])
    (array([ 5. , 12.5, 20. ]), True)
    """
    if not runs:
        raise ValueError("runs must hold at least one curve, got none")
    checked = [_checked(run, i)[0] for i, run in enumerate(runs)]
    if all(s.shape == checked[0].shape and (s == checked[0]).all() for s in checked) and points is None:
        return checked[0], False
    low, high = max(s[0] for s in checked), min(s[-1] for s in checked)
    if low > high:
        raise ValueError(f"runs must share a range of env steps, got one that ends at {high:g} before another's "
                         f"first evaluation at {low:g}; compare runs of one budget")
    count = points if points is not None else max(len(s) for s in checked)
    return np.linspace(low, high, max(count, 1) if low < high else 1), True


def align_runs(runs: Sequence[RunCurve], grid: Sequence[float]) -> np.ndarray:
    """Each run's returns at the env steps of ``grid`` (linear interpolation between its evaluations; a run
    evaluated twice at one step counts its last evaluation there): ``float64 [len(runs), len(grid)]``.

    >>> align_runs([([0, 10], [0.0, 5.0]), ([0, 4, 10], [1.0, 1.0, 2.0])], [0, 5, 10]).tolist()
    [[0.0, 2.5, 5.0], [1.0, 1.1666666666666667, 2.0]]
    """
    at = np.asarray(grid, dtype=np.float64)
    out = np.empty((len(runs), at.size))
    for i, run in enumerate(runs):
        steps, values = _checked(run, i)
        # np.interp takes the first of equal steps; the last evaluation at a step is the one a run reports
        last = np.append(steps[1:] != steps[:-1], True)
        out[i] = np.interp(at, steps[last], values[last])
    return out


def area_under_curve(grid: Sequence[float], values: Any) -> np.ndarray:
    """The area under each curve of ``values`` (``[..., len(grid)]``) over ``grid``'s env steps by the trapezoid
    rule, divided by the span of the grid: the curve's mean return over training, in the returns' own unit, so a
    run that learns sooner scores higher at the same final return. A one-step grid gives that step's value.

    >>> area_under_curve([0, 10, 20], [[0.0, 10.0, 10.0], [0.0, 0.0, 10.0]]).tolist()
    [7.5, 2.5]
    """
    x, y = np.asarray(grid, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if x.size == 1 or x[-1] == x[0]:
        return y[..., -1]
    # the trapezoid rule written out: np.trapezoid is numpy >= 2.0 only
    return ((y[..., 1:] + y[..., :-1]) / 2 * np.diff(x)).sum(axis=-1) / (x[-1] - x[0])


@dataclasses.dataclass(frozen=True)
class CurveEstimate:
    """An aggregate of runs at each step of a grid and its pointwise interval (nan where a task has one run).

    Attributes:
        env_steps: the grid, ``float64 [T]``.
        value: the aggregate at each step, ``float64 [T]``.
        low: the interval's lower bound at each step, ``float64 [T]``.
        high: its upper bound, ``float64 [T]``.
    """

    env_steps: np.ndarray
    value: np.ndarray
    low: np.ndarray
    high: np.ndarray

    def to_dict(self, name: str = "iqm") -> dict[str, list[float | None]]:
        """``{"env_steps", name, "low", "high"}`` as lists, a nan as None (JSON has no nan)."""
        def listed(a: np.ndarray) -> list[float | None]:
            return [None if math.isnan(v) else float(v) for v in a]

        return {"env_steps": listed(self.env_steps), name: listed(self.value), "low": listed(self.low),
                "high": listed(self.high)}
