import json
import math

import numpy as np
import pytest

scipy_stats = pytest.importorskip("scipy.stats", reason="the statistics need scipy: pip install 'rlstruct[stats]'")

from rlstruct.algos.statistics import (  # noqa: E402
    SCORE_TABLE,
    aggregate_scores,
    align_runs,
    area_under_curve,
    common_grid,
    curve_intervals,
    load_score_table,
    normalize_scores,
    optimality_gap,
)


def _trim(x, axis):
    return scipy_stats.trim_mean(x, 0.25, axis=axis)


def test_the_curve_interval_is_scipys_stratified_bootstrap_of_whole_runs():
    rng = np.random.default_rng(0)
    grid = np.array([0.0, 1e4, 2e4, 3e4])
    a, b = rng.normal(0, 1, (5, 4)).cumsum(axis=1), rng.normal(5, 2, (6, 4))
    est = curve_intervals({"a": a, "b": b}, grid, n_resamples=400, seed=7)
    # scipy's own call: the runs (axis 0) of each task resampled apart, the IQM of all runs at each step
    ref = scipy_stats.bootstrap((a, b), lambda x, y, axis: _trim(np.concatenate([x, y], axis), axis), axis=0,
                                n_resamples=400, method="percentile", vectorized=True, rng=np.random.default_rng(7))
    np.testing.assert_allclose(est.value, _trim(np.concatenate([a, b]), 0))
    np.testing.assert_allclose(est.low, ref.confidence_interval.low)
    np.testing.assert_allclose(est.high, ref.confidence_interval.high)
    # a run stays whole: the bootstrap at one step alone draws the same runs, so gives the same bounds
    one = scipy_stats.bootstrap((a[:, 2], b[:, 2]), lambda x, y, axis: _trim(np.concatenate([x, y], axis), axis),
                                n_resamples=400, method="percentile", vectorized=True, rng=np.random.default_rng(7))
    assert (est.low[2], est.high[2]) == pytest.approx(tuple(one.confidence_interval))
    assert curve_intervals({"a": a, "b": b}, grid, n_resamples=400, seed=7).to_dict() == est.to_dict()
    mean = curve_intervals(a, grid, aggregate="mean", n_resamples=100)
    np.testing.assert_allclose(mean.value, a.mean(axis=0))
    assert (mean.low <= mean.value + 1e-12).all() and (mean.value <= mean.high + 1e-12).all()


def test_curves_refuse_bad_input_in_one_line():
    with pytest.raises(ValueError, match=r"aggregate must be one of iqm, mean, median, got 'max'"):
        curve_intervals([[1.0]], [0], aggregate="max")
    with pytest.raises(ValueError, match=r"curves of task '' must be \[runs, 3\].*got shape \(2, 2\)"):
        curve_intervals([[1.0, 2.0], [3.0, 4.0]], [0, 1, 2])
    with pytest.raises(ValueError, match="run 1's env steps must not decrease, got \\[5.0, 2.0\\]"):
        common_grid([([0, 1], [0, 0]), ([5, 2], [0, 0])])
    with pytest.raises(ValueError, match="must share a range of env steps"):
        common_grid([([0, 10], [0, 0]), ([20, 30], [0, 0])])
    with pytest.raises(ValueError, match="run 0's curve must be finite"):
        align_runs([([0, 1], [0.0, float("nan")])], [0, 1])
    single = curve_intervals([[1.0, 2.0]], [0, 1])  # one run: nothing to resample
    assert single.to_dict()["low"] == [None, None]


def test_runs_evaluated_at_other_steps_meet_on_a_common_grid():
    runs = [([0, 100, 200, 300], [0.0, 10.0, 20.0, 30.0]), ([50, 150, 250], [5.0, 5.0, 5.0])]
    grid, interpolated = common_grid(runs)
    assert interpolated
    assert grid[0] == 50.0 and grid[-1] == 250.0 and len(grid) == 4  # no extrapolation past a run's evaluations
    aligned = align_runs(runs, grid)
    np.testing.assert_allclose(aligned[0], grid / 10.0)
    np.testing.assert_allclose(aligned[1], 5.0)
    # a step evaluated twice (a resumed run's last evaluation again) counts its last value
    assert align_runs([([0, 10, 10, 20], [0.0, 1.0, 3.0, 3.0])], [10]).tolist() == [[3.0]]


def test_the_area_under_the_curve_is_the_mean_return_over_training_and_its_iqm_interval_is_scipys():
    grid = [0.0, 50.0, 100.0]
    curves = np.array([[0.0, 100.0, 100.0], [0.0, 0.0, 100.0], [50.0, 50.0, 50.0], [0.0, 100.0, 200.0]])
    areas = area_under_curve(grid, curves)
    assert areas.tolist() == [75.0, 25.0, 50.0, 100.0]  # the first learns sooner than the second, same final
    assert area_under_curve([7.0], [[3.0]]).tolist() == [3.0]
    out = aggregate_scores(areas, names=("iqm",), n_resamples=300, seed=1)["iqm"]
    ref = scipy_stats.bootstrap((areas,), _trim, n_resamples=300, method="percentile", vectorized=True,
                                rng=np.random.default_rng(1))
    assert (out.low, out.high) == pytest.approx(tuple(ref.confidence_interval))


def test_normalised_aggregates_weigh_each_env_alike_with_the_optimality_gap():
    table = {"big": (0.0, 1000.0), "small": (-1.0, 1.0)}
    raw = {"big": [1000.0, 500.0, 0.0], "small": [1.0, 0.0, -1.0]}
    scores = normalize_scores(raw, table)
    assert scores["big"].tolist() == scores["small"].tolist() == [1.0, 0.5, 0.0]
    out = aggregate_scores(scores, names=("iqm", "optimality_gap"), n_resamples=300, seed=2)
    assert out["optimality_gap"].value == pytest.approx(0.5)
    ref = scipy_stats.bootstrap((scores["big"], scores["small"]),
                                lambda x, y, axis: np.maximum(1 - np.concatenate([x, y], axis), 0).mean(axis),
                                n_resamples=300, method="percentile", vectorized=True, rng=np.random.default_rng(2))
    assert (out["optimality_gap"].low, out["optimality_gap"].high) == pytest.approx(tuple(ref.confidence_interval))
    assert optimality_gap([1.5, 2.0]) == 0.0  # above the reference counts 0
    with pytest.raises(ValueError, match=r"env\(s\) other need a random and a reference score"):
        normalize_scores({"big": [1.0], "other": [2.0]}, table)
    with pytest.raises(ValueError, match=r"names must be among .*got \['max'\]"):
        aggregate_scores([1.0], names=("max",))


def test_the_shipped_score_table_cites_a_source_for_every_env_and_covers_the_presets_envs():
    content = json.loads(SCORE_TABLE.read_text())
    table = load_score_table()
    assert set(table) == set(content["envs"])
    for env, row in content["envs"].items():
        assert row["source"] in content["sources"], env
    # the envs the presets and the published page name
    for env in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1", "LunarLander-v3", "Hopper-v4",
                "HalfCheetah-v4", "Walker2d-v4", "ALE/Breakout-v5", "BreakoutNoFrameskip-v4",
                *(f"MinAtar/{g}-v1" for g in ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders"))):
        assert env in table, env
    assert table["ALE/Breakout-v5"] == (1.7, 30.5) and table["ALE/Pong-v5"] == (-20.7, 14.6)  # Mnih et al. 2015
    assert sum(1 for env in table if env.startswith("ALE/")) == 57  # Badia et al. 2020's Atari-57


@pytest.mark.parametrize("content, found", [
    ("{", "cannot be read"),
    ("[]", "must hold an object of env"),
    ('{"envs": {"X-v0": {"random": 1}}}', "env 'X-v0' finite, different"),
    ('{"X-v0": {"random": 1, "reference": 1}}', "env 'X-v0' finite, different"),
])
def test_a_bad_score_table_is_one_line_naming_the_file(tmp_path, content, found):
    path = tmp_path / "scores.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=found) as err:
        load_score_table(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    path.write_text('{"X-v0": {"random": 0, "reference": 2}}')
    assert load_score_table(path) == {"X-v0": (0.0, 2.0)}
    assert not math.isnan(load_score_table()["Pendulum-v1"][0])
