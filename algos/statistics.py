"""Statistics over the seeds of runs, as Agarwal et al. (2021, "Deep RL at the edge of the statistical precipice")
ask: the interquartile mean (IQM), the mean and the median with stratified bootstrap confidence intervals, the
probability of improvement of one group of runs over another, and performance profiles.

Scores are one number per run (e.g. the final evaluation return of each seed), given as a flat sequence (one task)
or as ``{task: scores}`` (several envs): the bootstrap then resamples the runs of each task separately (stratified).
The intervals are percentile intervals of :func:`scipy.stats.bootstrap`, seeded, so that the same scores give the
same numbers. Needs scipy (``pip install 'rlstruct[stats]'``); the plot needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from rlstruct.errors import MissingDependencyError

__all__ = [
    "Interval",
    "aggregate_scores",
    "iqm",
    "performance_profile",
    "performance_profile_interval",
    "plot_performance_profiles",
    "probability_of_improvement",
]

#: scores of one group of runs: a flat sequence (one task), or task name -> the scores of its runs
Scores = Union[Sequence[float], Mapping[str, Sequence[float]]]


def _scipy_stats() -> Any:
    """``scipy.stats``, or a :class:`MissingDependencyError` with the extra that installs it (``rlstruct compare``
    prints its one line)."""
    try:
        import scipy.stats
    except ImportError as e:
        raise MissingDependencyError("rlstruct compare and rlstruct.algos.statistics need scipy, which is not "
                                     "installed here; pip install 'rlstruct[stats]'") from e
    return scipy.stats


def iqm(scores: Any, axis: int = -1) -> Any:
    """The interquartile mean: the mean of the middle half of ``scores`` (25% trimmed from each end) along ``axis``.

    Robust to a few outlying seeds, and less noisy than the median (it averages half of the runs). With fewer than
    four scores nothing is trimmed, so it is their mean; as in :func:`scipy.stats.trim_mean`, the number trimmed at
    each end is ``floor(0.25 * n)``.

    >>> float(iqm([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 100.0]))
    4.5
    """
    return _scipy_stats().trim_mean(np.asarray(scores, dtype=np.float64), 0.25, axis=axis)


def _median(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(x, axis=axis)


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


#: the aggregates :func:`aggregate_scores` estimates: name -> function of the scores along an axis
AGGREGATES: dict[str, Callable[..., Any]] = {"iqm": iqm, "mean": _mean, "median": _median}


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate and its confidence interval ``[low, high]`` (nan where the runs are too few to resample).

    >>> str(Interval(4.5, 3.0, 6.25))
    '4.50 [3.00, 6.25]'
    """

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.2f} [{self.low:.2f}, {self.high:.2f}]"

    def to_dict(self) -> dict[str, float | None]:
        """``{"value", "low", "high"}``, a nan as None (JSON has no nan)."""
        return {k: None if math.isnan(v) else v for k, v in dataclasses.asdict(self).items()}


def _strata(scores: Scores) -> dict[str, np.ndarray]:
    """The scores as ``{task: float64 array}``, checked: at least one run per task, every score finite."""
    strata = {"": scores} if not isinstance(scores, Mapping) else dict(scores)
    if not strata:
        raise ValueError("scores must hold at least one task, got an empty mapping")
    out = {}
    for task, values in strata.items():
        array = np.asarray(values, dtype=np.float64)
        if array.ndim != 1 or array.size == 0:
            raise ValueError(f"scores of task {task!r} must be a flat sequence of one score per run, got shape "
                             f"{array.shape}")
        if not np.isfinite(array).all():
            raise ValueError(f"scores of task {task!r} must be finite, got {array.tolist()}; leave out the runs "
                             "that did not finish")
        out[task] = array
    return out


def _percentile_bounds(samples: list[np.ndarray], statistic: Callable[..., Any], *, confidence: float,
                       n_resamples: int, seed: int) -> tuple[Any, Any] | None:
    """``(low, high)``: the percentile interval of ``statistic`` (a number or an array of them) over resamples of
    each sample on its own (the strata); None when a sample has a single run (nothing to resample)."""
    bootstrap = _scipy_stats().bootstrap
    if min(len(s) for s in samples) < 2:
        return None
    # Percentile intervals (rliable's default): BCa's jackknife is undefined when every run scores the same.
    result = bootstrap(samples, statistic, n_resamples=n_resamples, confidence_level=confidence, method="percentile",
                       vectorized=True, rng=np.random.default_rng(seed))
    return result.confidence_interval.low, result.confidence_interval.high


def _bootstrap(samples: list[np.ndarray], statistic: Callable[..., Any], value: float, *, confidence: float,
               n_resamples: int, seed: int) -> Interval:
    """``value`` with the interval of :func:`_percentile_bounds` (nan bounds where there is none)."""
    bounds = _percentile_bounds(samples, statistic, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return Interval(value, math.nan, math.nan) if bounds is None else Interval(value, *map(float, bounds))


def aggregate_scores(scores: Scores, *, confidence: float = 0.95, n_resamples: int = 2000,
                     seed: int = 0) -> dict[str, Interval]:
    """The IQM, mean and median (:data:`AGGREGATES`) of ``scores`` over all runs of all tasks, each with its
    stratified bootstrap confidence interval.

    Args:
        scores: one score per run: a sequence, or ``{task: scores}`` (the runs of each task are resampled apart).
        confidence: the interval's confidence level.
        n_resamples: bootstrap resamples.
        seed: seeds the resampling: the same scores and seed give the same intervals.

    Returns:
        ``{"iqm": Interval, "mean": Interval, "median": Interval}``.

    Raises:
        ValueError: a task without runs, or a score that is not finite.

    >>> out = aggregate_scores([10.0, 20.0, 30.0, 40.0, 500.0])
    >>> round(out["iqm"].value, 2), out["median"].value, out["mean"].value
    (30.0, 30.0, 120.0)
    >>> out["iqm"].low <= out["iqm"].value <= out["iqm"].high
    True
    """
    samples = list(_strata(scores).values())
    everything = np.concatenate(samples)
    out = {}
    for name, function in AGGREGATES.items():
        def statistic(*resampled: np.ndarray, axis: int = -1, function: Callable[..., Any] = function) -> Any:
            return function(np.concatenate(resampled, axis=axis), axis=axis)

        out[name] = _bootstrap(samples, statistic, float(function(everything)), confidence=confidence,
                               n_resamples=n_resamples, seed=seed)
    return out


def _improvement(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """P(X > Y) over every pair of a run of ``x`` and a run of ``y``, a tie counting 1/2 (the Mann-Whitney U
    statistic over ``n * m``), along the last axis of both."""
    x, y = np.moveaxis(x, axis, -1)[..., :, None], np.moveaxis(y, axis, -1)[..., None, :]
    return ((x > y) + 0.5 * (x == y)).mean(axis=(-2, -1))


def probability_of_improvement(x: Scores, y: Scores, *, confidence: float = 0.95, n_resamples: int = 2000,
                               seed: int = 0) -> Interval:
    """The probability that a run of ``x`` scores higher than a run of ``y`` on the same task, a tie counting 1/2,
    averaged over the tasks both hold, with its stratified bootstrap confidence interval (the runs of each group and
    task resampled apart).

    Agarwal et al. (2021), section 4.3: ``P(X > Y) = 1/K sum_k 1/(N M) sum_i sum_j S(x_ki, y_kj)``, ``S`` being 1
    when ``x_ki > y_kj``, 1/2 when they are equal and 0 otherwise.

    Raises:
        ValueError: no task in common, a task without runs, or a score that is not finite.

    >>> round(probability_of_improvement([3.0, 4.0], [1.0, 3.0]).value, 3)
    0.875
    """
    xs, ys = _strata(x), _strata(y)
    tasks = [t for t in xs if t in ys]
    if not tasks:
        raise ValueError(f"x and y must share a task, got {sorted(xs)} and {sorted(ys)}")
    samples = [s for t in tasks for s in (xs[t], ys[t])]

    def statistic(*resampled: np.ndarray, axis: int = -1) -> Any:
        pairs = [_improvement(resampled[i], resampled[i + 1], axis) for i in range(0, len(resampled), 2)]
        return np.mean(pairs, axis=0)

    value = float(statistic(*samples))
    return _bootstrap(samples, statistic, value, confidence=confidence, n_resamples=n_resamples, seed=seed)


def performance_profile(scores: Scores, thresholds: Sequence[float]) -> np.ndarray:
    """The fraction of runs whose score is above each of ``thresholds`` (a run-score distribution, Agarwal et al.
    2021, section 4.2), the runs of every task pooled: ``float64 [len(thresholds)]``.

    >>> performance_profile([1.0, 2.0, 3.0, 4.0], [0.0, 2.0, 4.0]).tolist()
    [1.0, 0.5, 0.0]
    """
    pooled = np.concatenate(list(_strata(scores).values()))
    return (pooled[None, :] > np.asarray(thresholds, dtype=np.float64)[:, None]).mean(axis=1)


def performance_profile_interval(scores: Scores, thresholds: Sequence[float], *, confidence: float = 0.95,
                                 n_resamples: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The pointwise stratified bootstrap interval of :func:`performance_profile`: ``(low, high)``, each
    ``float64 [len(thresholds)]`` (nan where a task has a single run).

    >>> low, high = performance_profile_interval([1.0, 2.0, 3.0, 4.0], [0.0, 2.5, 5.0])
    >>> low.tolist(), high.tolist()
    ([1.0, 0.0, 0.0], [1.0, 1.0, 0.0])
    """
    samples = list(_strata(scores).values())
    at = np.asarray(thresholds, dtype=np.float64)

    def statistic(*resampled: np.ndarray, axis: int = -1) -> np.ndarray:
        pooled = np.moveaxis(np.concatenate(resampled, axis=axis), axis, -1)
        # the thresholds first: scipy's layout for a statistic with several values
        return np.moveaxis((pooled[..., None, :] > at[:, None]).mean(axis=-1), -1, 0)

    bounds = _percentile_bounds(samples, statistic, confidence=confidence, n_resamples=n_resamples, seed=seed)
    if bounds is None:
        return np.full(at.shape, math.nan), np.full(at.shape, math.nan)
    return np.asarray(bounds[0], dtype=np.float64), np.asarray(bounds[1], dtype=np.float64)


def plot_performance_profiles(groups: Mapping[str, Scores], path: str | Path, *, points: int = 101,
                              xlabel: str = "evaluation return") -> Path:
    """Draws the performance profile of each group (one line each, over thresholds spanning every score, with its
    95% interval of :func:`performance_profile_interval` shaded) into a PNG at ``path``; returns ``path``.

    Raises:
        MissingDependencyError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("plot_performance_profiles draws with matplotlib, which is not installed here; "
                                     "pip install 'rlstruct[plot]'") from None
    pooled = np.concatenate([s for scores in groups.values() for s in _strata(scores).values()])
    low, high = float(pooled.min()), float(pooled.max())
    pad = max(high - low, 1.0) * 0.05
    thresholds = np.linspace(low - pad, high + pad, points)
    fig, ax = plt.subplots(figsize=(6, 4))
    try:
        for name, scores in groups.items():
            (line,) = ax.step(thresholds, performance_profile(scores, thresholds), where="post", label=name)
            low, high = performance_profile_interval(scores, thresholds)
            ax.fill_between(thresholds, low, high, step="post", color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xlabel(f"{xlabel} threshold")
        ax.set_ylabel("fraction of runs above it")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return Path(path)
