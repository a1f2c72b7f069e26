import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

scipy_stats = pytest.importorskip("scipy.stats", reason="the statistics need scipy: pip install 'rlstruct[stats]'")

from rlstruct.algos.statistics import (  # noqa: E402
    aggregate_scores,
    iqm,
    performance_profile,
    performance_profile_interval,
    plot_performance_profiles,
    probability_of_improvement,
)


def test_iqm_is_the_mean_of_the_middle_half():
    # 12 runs: 3 trimmed from each end, the mean of the 6 in the middle
    scores = [-50.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 1e6]
    assert iqm(scores) == pytest.approx((3 + 4 + 5 + 6 + 7 + 8) / 6)
    assert iqm([7.0, 1.0, 4.0]) == pytest.approx(4.0)  # fewer than four: nothing trimmed


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=3).flatmap(
    lambda first: st.lists(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=len(first), max_size=len(first)),
                           min_size=0, max_size=4).map(lambda rest: [first, *rest])))
def test_iqm_gives_scipys_trim_mean_bits_along_either_axis(rows):
    # iqm is scipy.stats.trim_mean(x, 0.25) written in numpy: the same partition, so the same bits
    x = np.array(rows).T  # [runs per column, columns] with 1-3 rows: trimming from 0 to several per end
    for axis in (0, -1):
        np.testing.assert_array_equal(iqm(x, axis=axis), scipy_stats.trim_mean(x, 0.25, axis=axis))


def test_probability_of_improvement_counts_ties_as_half():
    x, y = [1.0, 2.0, 3.0], [2.0, 2.0, 0.0]
    # pairs (x_i > y_j): 1 -> 0 + 0 + 1; 2 -> .5 + .5 + 1; 3 -> 1 + 1 + 1
    expected = (1 + 2 + 3) / 9
    assert probability_of_improvement(x, y).value == pytest.approx(expected)
    assert probability_of_improvement(y, x).value == pytest.approx(1 - expected)
    assert probability_of_improvement([5.0, 5.0], [5.0, 5.0]).value == 0.5


def test_probability_of_improvement_averages_over_the_shared_tasks():
    x = {"a": [1.0, 2.0], "b": [10.0, 10.0], "only-x": [0.0, 0.0]}
    y = {"a": [3.0, 4.0], "b": [0.0, 1.0]}
    assert probability_of_improvement(x, y).value == pytest.approx((0.0 + 1.0) / 2)
    with pytest.raises(ValueError, match="must share a task"):
        probability_of_improvement({"a": [1.0]}, {"b": [1.0]})


def test_intervals_are_scipys_stratified_percentile_bootstrap_and_seeded():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, 1, 5), rng.normal(10, 3, 7)
    out = aggregate_scores({"a": a, "b": b}, n_resamples=500, seed=3)
    # the same bootstrap written out: each task resampled apart, IQM of all runs together
    ref = scipy_stats.bootstrap((a, b), lambda x, y, axis: scipy_stats.trim_mean(np.concatenate([x, y], axis), 0.25,
                                                                                 axis=axis),
                                n_resamples=500, method="percentile", vectorized=True, rng=np.random.default_rng(3))
    assert out["iqm"].value == pytest.approx(iqm(np.concatenate([a, b])))
    assert (out["iqm"].low, out["iqm"].high) == pytest.approx(tuple(ref.confidence_interval))
    assert aggregate_scores({"a": a, "b": b}, n_resamples=500, seed=3) == out  # same input and seed, same numbers
    assert aggregate_scores({"a": a, "b": b}, n_resamples=500, seed=4)["iqm"] != out["iqm"]
    for name in ("mean", "median"):
        assert out[name].low <= out[name].value <= out[name].high


def test_improvement_interval_matches_a_hand_bootstrap():
    x, y = np.array([1.0, 3.0, 4.0, 6.0]), np.array([0.0, 2.0, 3.0])

    def p(xs, ys, axis):
        return np.mean([[(a > b) + 0.5 * (a == b) for a, b in itertools.product(xi, yi)]
                        for xi, yi in zip(np.moveaxis(xs, axis, -1).reshape(-1, len(x)),
                                          np.moveaxis(ys, axis, -1).reshape(-1, len(y)))], axis=1)

    ref = scipy_stats.bootstrap((x, y), lambda a, b, axis: p(a, b, axis), n_resamples=200, method="percentile",
                                vectorized=True, rng=np.random.default_rng(0))
    got = probability_of_improvement(x, y, n_resamples=200, seed=0)
    assert got.value == pytest.approx(9.5 / 12)
    assert (got.low, got.high) == pytest.approx(tuple(ref.confidence_interval))


def test_a_single_run_has_no_interval_and_bad_scores_are_refused():
    out = aggregate_scores([3.0])
    assert out["iqm"].value == 3.0 and math.isnan(out["iqm"].low) and math.isnan(out["iqm"].high)
    assert out["iqm"].to_dict() == {"value": 3.0, "low": None, "high": None}
    with pytest.raises(ValueError, match="must be finite"):
        aggregate_scores([1.0, float("nan")])
    with pytest.raises(ValueError, match="flat sequence"):
        aggregate_scores({"a": []})


def test_performance_profiles_and_their_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib: pip install 'rlstruct[plot]'")
    assert performance_profile({"a": [1.0, 3.0], "b": [5.0]}, [0.0, 2.0, 5.0]).tolist() == [1.0, 2 / 3, 0.0]
    path = plot_performance_profiles({"x": [1.0, 2.0], "y": [2.0, 3.0]}, tmp_path / "profile.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_the_profiles_interval_is_scipys_bootstrap_of_the_fraction_above_each_threshold():
    scores = {"a": [1.0, 4.0, 6.0, 9.0], "b": [2.0, 3.0, 8.0]}
    low, high = performance_profile_interval(scores, [0.0, 5.0, 10.0], n_resamples=300, seed=2)
    ref = scipy_stats.bootstrap((np.array(scores["a"]), np.array(scores["b"])),
                                lambda x, y, axis: (np.concatenate([x, y], axis) > 5.0).mean(axis),
                                n_resamples=300, method="percentile", vectorized=True, rng=np.random.default_rng(2))
    assert (low[1], high[1]) == pytest.approx(tuple(ref.confidence_interval))
    assert low[0] == high[0] == 1.0 and low[2] == high[2] == 0.0
    assert all(math.isnan(v) for v in performance_profile_interval([3.0], [1.0, 2.0])[0])
