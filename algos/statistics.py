"""Statistics over the seeds of runs, as Agarwal et al. (2021, "Deep RL at the edge of the statistical precipice")
ask: the interquartile mean (IQM), the mean and the median with stratified bootstrap confidence intervals, the
probability of improvement of one group of runs over another, performance profiles, and learning curves over seeds
with their intervals (:func:`curve_intervals` and the area under a run's curve, :func:`area_under_curve`). Scores of
several envs are made comparable by :func:`normalize_scores` (a random policy 0, a reference 1, from the table the
package ships, :func:`load_score_table`), and then the optimality gap (:func:`optimality_gap`) reads too.

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

from rlstruct._plot import PLAIN_TEXT, plain_text
from rlstruct.algos._curves import CurveEstimate, Curves
from rlstruct.algos._curves import align_runs as align_runs
from rlstruct.algos._curves import area_under_curve as area_under_curve
from rlstruct.algos._curves import common_grid as common_grid
from rlstruct.errors import MissingDependencyError

# align_runs, area_under_curve and common_grid are this module's too, left out of __all__ for the names' budget
__all__ = [
    "Interval",
    "aggregate_scores",
    "curve_intervals",
    "iqm",
    "normalize_scores",
    "performance_profile",
    "performance_profile_interval",
    "plot_performance_profiles",
    "probability_of_improvement",
]

#: scores of one group of runs: a flat sequence (one task), or task name -> the scores of its runs
Scores = Union[Sequence[float], Mapping[str, Sequence[float]]]


def _scipy_stats() -> Any:
    """``scipy.stats``, or a :class:`MissingDependencyError` with the extra that installs it (``rlstruct compare``
    and ``rlstruct report`` print its one line)."""
    try:
        import scipy.stats
    except ImportError as e:
        raise MissingDependencyError("rlstruct compare, rlstruct report and rlstruct.algos.statistics need scipy, "
                                     "which is not installed here; pip install 'rlstruct[stats]'") from e
    return scipy.stats


def iqm(scores: Any, axis: int = -1) -> Any:
    """The interquartile mean: the mean of the middle half of ``scores`` (25% trimmed from each end) along ``axis``.

    Robust to a few outlying seeds, and less noisy than the median (it averages half of the runs). With fewer than
    four scores nothing is trimmed, so it is their mean; as in :func:`scipy.stats.trim_mean`, the number trimmed at
    each end is ``floor(0.25 * n)``.

    >>> float(iqm([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 100.0]))
    4.5
    """
    # scipy.stats.trim_mean's steps in numpy (one partition, the middle's mean): the same bits, and a one-run
    # `rlstruct compare` needs no scipy import (about 2 CPU s) for it
    a = np.asarray(scores, dtype=np.float64)
    if a.size == 0:
        return np.nan
    n = a.shape[axis]
    low = int(0.25 * n)
    part = np.partition(a, (low, n - low - 1), axis)
    middle = [slice(None)] * a.ndim
    middle[axis] = slice(low, n - low)
    return np.mean(part[tuple(middle)], axis=axis)


def _median(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(x, axis=axis)


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def optimality_gap(scores: Any, axis: int = -1, threshold: float = 1.0) -> Any:
    """The optimality gap: the mean of how far each score falls short of ``threshold`` (``max(threshold - x, 0)``),
    along ``axis``: Agarwal et al. (2021), section 4.1, on normalised scores where 1 is the reference's. Lower is
    better; a run above the reference counts 0, so one outlying seed cannot hide the others' shortfall.

    >>> float(optimality_gap([0.5, 1.0, 2.0]))
    0.16666666666666666
    """
    return np.maximum(threshold - np.asarray(scores, dtype=np.float64), 0.0).mean(axis=axis)


#: the aggregates :func:`aggregate_scores` can estimate: name -> function of the scores along an axis
AGGREGATES: dict[str, Callable[..., Any]] = {"iqm": iqm, "mean": _mean, "median": _median,
                                             "optimality_gap": optimality_gap}
#: the aggregates of raw scores (the optimality gap is read on normalised scores only)
RAW_AGGREGATES = ("iqm", "mean", "median")


def _over_strata(name: str) -> Callable[..., Any]:
    """The aggregate ``name`` of the runs of several strata (tasks), each ``[..., runs_k]`` along ``axis``: the
    aggregate of all runs pooled, except the median of several tasks, which is the median over the tasks of each
    task's mean score (Agarwal et al. 2021 and rliable, as the median human-normalised score of Atari): pooled, the
    median of a multi-task group would be one task's run. Of one task, the median is the median of its runs."""
    function = AGGREGATES[name]

    def statistic(*strata: np.ndarray, axis: int = -1) -> Any:
        if name == "median" and len(strata) > 1:
            return np.median(np.stack([np.mean(s, axis=axis) for s in strata], axis=-1), axis=-1)
        return function(np.concatenate(strata, axis=axis), axis=axis)

    return statistic


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
                       n_resamples: int, seed: int, axis: int = 0) -> tuple[Any, Any] | None:
    """``(low, high)``: the percentile interval of ``statistic`` (a number or an array of them) over resamples of
    each sample on its own (the strata) along ``axis``, the runs' axis; None when a sample has a single run (nothing
    to resample)."""
    bootstrap = _scipy_stats().bootstrap
    if min(s.shape[axis] for s in samples) < 2:
        return None
    # Percentile intervals (rliable's default): BCa's jackknife is undefined when every run scores the same.
    result = bootstrap(samples, statistic, n_resamples=n_resamples, confidence_level=confidence, method="percentile",
                       vectorized=True, rng=np.random.default_rng(seed), axis=axis)
    return result.confidence_interval.low, result.confidence_interval.high


def curve_intervals(curves: Curves, grid: Sequence[float], *, aggregate: str = "iqm", confidence: float = 0.95,
                    n_resamples: int = 2000, seed: int = 0) -> CurveEstimate:
    """The ``aggregate`` (``"iqm"``, ``"mean"`` or ``"median"``) of the runs at each step of ``grid``, with its
    pointwise percentile interval from :func:`scipy.stats.bootstrap`: the runs (rows) resampled, task by task, the
    same resampled runs at every step (a run's curve stays whole).

    Args:
        curves: ``float64 [runs, len(grid)]`` (one task) or ``{task: float64 [runs_k, len(grid)]}``.
        grid: the env steps of the columns.
        aggregate: the statistic over the runs of all tasks at one step.
        confidence: the interval's confidence level.
        n_resamples: bootstrap resamples.
        seed: seeds the resampling.

    Raises:
        ValueError: an unknown aggregate, a task without runs, a width that is not the grid's, a value not finite.

    >>> est = curve_intervals([[0.0, 1.0], [0.0, 3.0], [0.0, 2.0]], [0, 100], aggregate="mean", n_resamples=200)
    >>> est.value.tolist(), bool(est.low[1] <= 2.0 <= est.high[1])
    ([0.0, 2.0], True)
    """
    if aggregate not in AGGREGATES or aggregate == "optimality_gap":
        raise ValueError(f"aggregate must be one of iqm, mean, median, got {aggregate!r}")
    at = np.asarray(grid, dtype=np.float64)
    strata = {"": curves} if not isinstance(curves, Mapping) else dict(curves)
    samples = []
    for task, runs in strata.items():
        array = np.asarray(runs, dtype=np.float64)
        if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] != at.size:
            raise ValueError(f"curves of task {task!r} must be [runs, {at.size}] (one row per run on the grid), got "
                             f"shape {array.shape}")
        if not np.isfinite(array).all():
            raise ValueError(f"curves of task {task!r} must be finite; leave out the runs that did not finish")
        samples.append(array)
    statistic = _over_strata(aggregate)
    value = statistic(*samples, axis=0)
    # axis 0: the runs are resampled, each resample keeping a run's whole curve
    bounds = _percentile_bounds(samples, statistic, confidence=confidence, n_resamples=n_resamples, seed=seed, axis=0)
    if bounds is None:
        nan = np.full(at.shape, math.nan)
        return CurveEstimate(at, np.asarray(value, dtype=np.float64), nan, nan.copy())
    return CurveEstimate(at, np.asarray(value, dtype=np.float64), np.asarray(bounds[0], dtype=np.float64),
                         np.asarray(bounds[1], dtype=np.float64))


def _bootstrap(samples: list[np.ndarray], statistic: Callable[..., Any], value: float, *, confidence: float,
               n_resamples: int, seed: int) -> Interval:
    """``value`` with the interval of :func:`_percentile_bounds` (nan bounds where there is none)."""
    bounds = _percentile_bounds(samples, statistic, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return Interval(value, math.nan, math.nan) if bounds is None else Interval(value, *map(float, bounds))


def aggregate_scores(scores: Scores, *, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0,
                     names: Sequence[str] = RAW_AGGREGATES) -> dict[str, Interval]:
    """The IQM, mean and median (or the ``names`` of :data:`AGGREGATES`) of ``scores`` over all runs of all tasks,
    each with its stratified bootstrap confidence interval; the median of several tasks is the median over the tasks
    of each task's mean score, as rliable's.

    Args:
        scores: one score per run: a sequence, or ``{task: scores}`` (the runs of each task are resampled apart).
        confidence: the interval's confidence level.
        n_resamples: bootstrap resamples.
        seed: seeds the resampling: the same scores and seed give the same intervals.
        names: the aggregates; add ``"optimality_gap"`` for normalised scores.

    Returns:
        ``{"iqm": Interval, "mean": Interval, "median": Interval}`` (one entry per name).

    Raises:
        ValueError: a task without runs, a score that is not finite, or an unknown name.

    >>> out = aggregate_scores([10.0, 20.0, 30.0, 40.0, 500.0])
    >>> round(out["iqm"].value, 2), out["median"].value, out["mean"].value
    (30.0, 30.0, 120.0)
    >>> out["iqm"].low <= out["iqm"].value <= out["iqm"].high
    True
    """
    unknown = [n for n in names if n not in AGGREGATES]
    if unknown:
        raise ValueError(f"names must be among {sorted(AGGREGATES)}, got {unknown}")
    samples = list(_strata(scores).values())
    out = {}
    for name in names:
        statistic = _over_strata(name)
        out[name] = _bootstrap(samples, statistic, float(statistic(*samples)), confidence=confidence,
                               n_resamples=n_resamples, seed=seed)
    return out


#: the score table the package ships: per env, a random policy's score and a reference score, with their sources
SCORE_TABLE = Path(__file__).resolve().parent / "data" / "score_table.json"


def load_score_table(path: str | Path | None = None) -> dict[str, tuple[float, float]]:
    """The normalisation table at ``path`` (default: :data:`SCORE_TABLE`, the one the package ships): env id ->
    ``(random, reference)``. The file is a JSON object ``{"envs": {ENV: {"random": R, "reference": S, ...}}}`` (other
    keys, such as each row's source, are kept for the reader) or that ``envs`` object alone.

    Raises:
        ValueError: the file cannot be read as such a table (the message names the file and the env).

    >>> load_score_table()["CartPole-v1"][1]
    475.0
    """
    import json

    source = Path(SCORE_TABLE if path is None else path)
    try:
        content = json.loads(source.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"the score table {source} must be a JSON file, got one that cannot be read "
                         f"({str(e).splitlines()[0]}); pass a JSON object of env -> {{random, reference}}") from None
    envs = content.get("envs", content) if isinstance(content, dict) else None
    if not isinstance(envs, dict) or not envs:
        raise ValueError(f"the score table {source} must hold an object of env -> {{\"random\": R, \"reference\": "
                         f"S}}, got {type(envs).__name__ if envs is not None else type(content).__name__}")
    table = {}
    for env, row in envs.items():
        values = [row.get(k) if isinstance(row, dict) else None for k in ("random", "reference")]
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in values) \
                or values[0] == values[1]:
            raise ValueError(f"the score table {source} must give env {env!r} finite, different \"random\" and "
                             f"\"reference\" numbers, got {row!r}; fix its row")
        table[str(env)] = (float(values[0]), float(values[1]))
    return table


def normalize_scores(scores: Mapping[str, Sequence[float]],
                     table: Mapping[str, tuple[float, float]]) -> dict[str, np.ndarray]:
    """Min-max normalised scores: ``(x - random) / (reference - random)`` per env, so that a random policy scores 0
    and the reference 1 on every env, and an aggregate over envs weighs each env alike.

    Raises:
        ValueError: an env has no row in ``table`` (the message names every such env).

    >>> normalize_scores({"CartPole-v1": [500.0, 261.0]}, {"CartPole-v1": (22.0, 500.0)})["CartPole-v1"].tolist()
    [1.0, 0.5]
    """
    missing = sorted(env for env in scores if env not in table)
    if missing:
        raise ValueError(f"scores of env(s) {', '.join(missing)} need a random and a reference score to be "
                         "normalised, got none in the score table; pass --normalize FILE with a row for each")
    return {env: (np.asarray(values, dtype=np.float64) - table[env][0]) / (table[env][1] - table[env][0])
            for env, values in scores.items()}


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
    95% interval of :func:`performance_profile_interval` shaded) into a PNG at ``path``; returns ``path``. The
    groups' names are drawn as they are (no mathtext, no LaTeX: :func:`rlstruct._plot.plain_text`).

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
    with plt.rc_context(PLAIN_TEXT):
        fig, ax = plt.subplots(figsize=(6, 4))
        try:
            for name, scores in groups.items():
                (line,) = ax.step(thresholds, performance_profile(scores, thresholds), where="post",
                                  label=plain_text(name))
                low, high = performance_profile_interval(scores, thresholds)
                ax.fill_between(thresholds, low, high, step="post", color=line.get_color(), alpha=0.2, linewidth=0)
            ax.set_xlabel(plain_text(f"{xlabel} threshold"))
            ax.set_ylabel("fraction of runs above it")
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
            ax.legend()
            fig.tight_layout()
            fig.savefig(path, dpi=100)
        finally:
            plt.close(fig)
    return Path(path)
