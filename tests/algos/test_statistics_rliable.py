"""The statistics held against rliable (Agarwal et al. 2021), the field's own code: the same scores give the same
point estimates digit for digit, and intervals that agree within the bootstrap's Monte Carlo error (rliable resamples
with arch's generator, rlstruct with scipy's, so the bounds agree in distribution, not digit for digit).

The scores are built so that stratification matters: three tasks on scales a thousand times apart. A bootstrap that
pooled the runs of every task before resampling gives bounds far outside the tolerance, which the tests check too, so
that the tolerance tells a stratified bootstrap from one that is not."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("scipy.stats", reason="the statistics need scipy: pip install 'rlstruct[stats]'")
rly = pytest.importorskip("rliable.library", reason="the reference is rliable (the test extra installs it)")
rly_metrics = pytest.importorskip("rliable.metrics")

from rlstruct.algos.statistics import (  # noqa: E402
    aggregate_scores,
    curve_intervals,
    iqm,
    performance_profile,
    performance_profile_interval,
    probability_of_improvement,
)

#: rliable resamples in a Python loop (about 5 ms a resample for the probability of improvement): 2,000 keep the
#: statistics it resamples here near 4 CPU s
# rliable 1.2 hands arch the RandomState it is given, which arch 7 warns about
pytestmark = pytest.mark.filterwarnings("ignore:random_state is deprecated:FutureWarning")

RESAMPLES = 2_000
#: a bound may differ from rliable's by this fraction of the interval's width: over 2,000 resamples the 2.5% and 97.5%
#: quantiles rest on 50 resamples each, and the bounds of the two implementations differ by up to 4% of the width on
#: these scores; a pooled (unstratified) bootstrap's by several times the width
TOLERANCE = 0.1
#: rliable's intervals of the two statistics whose resampling is a Python loop of about 5 ms a resample (11 CPU s
#: together), recorded with the versions the file names: ``python -m tests.algos.test_statistics_rliable`` writes it
#: again. Their point estimates are rliable's, computed here, and the other statistics' intervals rliable's own.
RECORDED = Path(__file__).resolve().parents[1] / "data" / "rliable_intervals.json"


def scores_matrix(seed: int, runs: int = 10) -> np.ndarray:
    """``[runs, 3]``: three tasks whose returns lie a thousand times apart, a skewed one among them."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.normal(1.0, 0.3, runs), rng.gamma(2.0, 50.0, runs), rng.normal(900.0, 120.0, runs)], axis=1)


def as_tasks(matrix: np.ndarray) -> dict[str, list[float]]:
    return {f"task{k}": matrix[:, k].tolist() for k in range(matrix.shape[1])}


def rliable_interval(data, func) -> tuple[np.ndarray, np.ndarray]:
    """rliable's point estimate and ``[2, ...]`` percentile interval of ``func`` over ``data`` (one array, or a tuple of
    arrays resampled together)."""
    points, intervals = rly.get_interval_estimates({"g": data}, func, reps=RESAMPLES,
                                                   random_state=np.random.RandomState(7))
    return points["g"], intervals["g"]


def assert_bounds_agree(low, high, reference: np.ndarray) -> None:
    low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    width = np.maximum(reference[1] - reference[0], 1e-12)
    assert np.all(np.abs(low - reference[0]) <= TOLERANCE * width), (low, reference[0], width)
    assert np.all(np.abs(high - reference[1]) <= TOLERANCE * width), (high, reference[1], width)


AGGREGATES = {"iqm": rly_metrics.aggregate_iqm, "mean": rly_metrics.aggregate_mean,
              "median": rly_metrics.aggregate_median}


@pytest.mark.parametrize("name", sorted(AGGREGATES))
def test_the_aggregates_over_tasks_are_rliables(name):
    matrix = scores_matrix(0)
    ours = aggregate_scores(as_tasks(matrix), n_resamples=RESAMPLES, seed=1, names=(name,))[name]
    point, interval = rliable_interval(matrix, lambda x: np.array([AGGREGATES[name](x)]))
    assert ours.value == pytest.approx(float(point[0]), rel=1e-12)
    assert_bounds_agree(ours.low, ours.high, interval[:, 0])


def test_the_tolerance_tells_a_stratified_bootstrap_from_a_pooled_one():
    """The same IQM with the runs of every task pooled before resampling (not stratified) misses rliable's bounds."""
    matrix = scores_matrix(0)
    pooled = aggregate_scores(matrix.ravel().tolist(), n_resamples=RESAMPLES, seed=1, names=("iqm",))["iqm"]
    _, interval = rliable_interval(matrix, lambda x: np.array([rly_metrics.aggregate_iqm(x)]))
    with pytest.raises(AssertionError):
        assert_bounds_agree(pooled.low, pooled.high, interval[:, 0])


def test_the_optimality_gap_of_normalised_scores_is_rliables():
    matrix = scores_matrix(3) / np.array([1.5, 150.0, 1000.0])  # about 0-1: some runs above the threshold 1
    ours = aggregate_scores(as_tasks(matrix), n_resamples=RESAMPLES, seed=1,
                            names=("optimality_gap",))["optimality_gap"]
    point, interval = rliable_interval(matrix, lambda x: np.array([rly_metrics.aggregate_optimality_gap(x)]))
    assert ours.value == pytest.approx(float(point[0]), rel=1e-12)
    assert_bounds_agree(ours.low, ours.high, interval[:, 0])


def improvement_pair() -> tuple[np.ndarray, np.ndarray]:
    return scores_matrix(4), scores_matrix(5) * np.array([1.1, 0.9, 1.05])


def improvement(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.array([rly_metrics.probability_of_improvement(a, b)])


def recorded(name: str) -> np.ndarray:
    """rliable's ``[2, ...]`` interval ``name`` from :data:`RECORDED`."""
    return np.asarray(json.loads(RECORDED.read_text())["intervals"][name], dtype=np.float64)


def test_the_probability_of_improvement_is_rliables():
    x, y = improvement_pair()
    ours = probability_of_improvement(as_tasks(x), as_tasks(y), n_resamples=RESAMPLES, seed=1)
    assert ours.value == pytest.approx(float(improvement(x, y)[0]), rel=1e-12)
    assert_bounds_agree(ours.low, ours.high, recorded("probability_of_improvement")[:, 0])


def test_the_performance_profile_and_its_band_are_rliables():
    matrix = scores_matrix(6) / np.array([1.5, 150.0, 1000.0])
    taus = np.linspace(0.0, 1.5, 7)
    profiles, _ = rly.create_performance_profile({"g": matrix}, taus, reps=RESAMPLES)
    np.testing.assert_allclose(performance_profile(as_tasks(matrix), taus), profiles["g"], rtol=0, atol=1e-12)
    low, high = performance_profile_interval(as_tasks(matrix), taus, n_resamples=RESAMPLES, seed=1)
    # rliable's create_performance_profile takes no generator (its band changes from call to call); the same band
    # from its get_interval_estimates with rliable's own profile function and a seeded generator
    _, band = rliable_interval(matrix, lambda x: rly.score_distributions(x, taus))
    # rliable's band is of the mean over tasks of each task's fraction, which with the same runs in every task is the
    # pooled fraction of 30 runs: a statistic on a lattice of 1/30, whose 2.5% quantile jumps a whole step when the
    # quantile's resample falls on either side of one; measured over eight rliable generators, the bounds differ by
    # zero or exactly one step
    step = 1.0 / matrix.size
    assert np.all(np.abs(low - band[0]) <= step + 1e-9), (low, band[0])
    assert np.all(np.abs(high - band[1]) <= step + 1e-9), (high, band[1])
    assert np.abs(low - band[0]).mean() + np.abs(high - band[1]).mean() <= step, "the bounds differ at most taus"


STEPS = np.arange(1, 6) * 10_000


def seed_curves() -> np.ndarray:
    """``[runs, tasks, steps]``: ten runs' curves over :data:`STEPS` on three tasks of different scales."""
    rng = np.random.default_rng(8)
    scale = np.array([1.0, 100.0, 1000.0])[None, :, None]
    return scale * (STEPS[None, None, :] / STEPS[-1]) * rng.gamma(3.0, 1.0 / 3.0, size=(10, 3, 1)) \
        + scale * rng.normal(0.0, 0.05, size=(10, 3, STEPS.size))


def iqm_curve(x: np.ndarray) -> np.ndarray:
    return np.array([rly_metrics.aggregate_iqm(x[..., j]) for j in range(x.shape[-1])])


def test_the_curves_over_seeds_are_rliables_sample_efficiency_curves():
    """rliable's curves: the aggregate at each evaluation of a ``[runs, tasks, steps]`` array, each run's curve
    resampled whole."""
    curves = seed_curves()
    ours = curve_intervals({f"task{k}": curves[:, k, :] for k in range(3)}, STEPS, n_resamples=RESAMPLES, seed=1)
    np.testing.assert_allclose(ours.value, iqm_curve(curves), rtol=1e-12)
    assert_bounds_agree(ours.low, ours.high, recorded("iqm_curve"))


def test_the_recorded_intervals_are_of_these_scores():
    """The record names the resamples and generator these tests use and the points its intervals surround."""
    record = json.loads(RECORDED.read_text())
    assert record["resamples"] == RESAMPLES and record["random_state"] == 7
    points = {"probability_of_improvement": improvement(*improvement_pair()), "iqm_curve": iqm_curve(seed_curves())}
    for name, point in points.items():
        low, high = recorded(name)
        assert np.all(low <= point) and np.all(point <= high), (name, low, point, high)


def test_the_iqm_trims_as_rliable_at_every_count_of_runs():
    rng = np.random.default_rng(9)
    for runs in range(1, 14):
        x = rng.normal(size=(runs, 1))
        assert iqm(x.ravel()) == pytest.approx(rly_metrics.aggregate_iqm(x), rel=1e-12)


def record() -> None:
    """Writes :data:`RECORDED`: rliable's intervals of :func:`test_the_probability_of_improvement_is_rliables`'s and
    :func:`test_the_curves_over_seeds_are_rliables_sample_efficiency_curves`'s scores."""
    intervals = {"probability_of_improvement": rliable_interval(improvement_pair(), improvement)[1],
                 "iqm_curve": rliable_interval(seed_curves(), iqm_curve)[1]}
    RECORDED.parent.mkdir(exist_ok=True)
    RECORDED.write_text(json.dumps({
        "rliable": version("rliable"), "arch": version("arch"), "numpy": np.__version__, "resamples": RESAMPLES,
        "random_state": 7, "intervals": {k: v.tolist() for k, v in intervals.items()}}, indent=1) + "\n")


if __name__ == "__main__":
    record()
