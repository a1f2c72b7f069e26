import json
import sys

import pytest

pytest.importorskip("scipy.stats", reason="rlstruct compare needs scipy: pip install 'rlstruct[stats]'")

from rlstruct.algos._train import cli  # noqa: E402
from rlstruct.algos._train.compare import compare_groups, load_group  # noqa: E402
from rlstruct.algos.statistics import iqm  # noqa: E402
from rlstruct.errors import ConfigError, RunRecordError  # noqa: E402


def _runs(folder, returns, env="CartPole-v1"):
    for seed, value in enumerate(returns):
        run = folder / f"seed-{seed}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"eval_return": value, "env_steps": 100}))
        (run / "config.json").write_text(json.dumps({"algo": "ppo", "env": env, "seed": seed}))


def test_compare_reads_groups_of_runs_and_prints_json(tmp_path, capsys):
    _runs(tmp_path / "a", [500.0, 480.0, 200.0, 500.0, 450.0])
    _runs(tmp_path / "b", [100.0, 150.0, 480.0, 90.0, 120.0])
    assert cli.main(["compare", str(tmp_path / "a"), f"base={tmp_path}/b/seed-*", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    a, base = out["groups"]["a"], out["groups"]["base"]
    assert len(a["runs"]) == 5 and a["scores"] == {"CartPole-v1": [500.0, 480.0, 200.0, 500.0, 450.0]}
    assert a["iqm"]["value"] == pytest.approx(iqm([500.0, 480.0, 200.0, 500.0, 450.0]))
    assert base["median"]["value"] == 120.0
    # 25 pairs: a beats b in all but (200 < 480), (450 < 480), (480 == 480: a half)
    p = {(q["x"], q["y"]): q for q in out["improvement"]}
    assert p["a", "base"]["value"] == pytest.approx(22.5 / 25)
    assert p["base", "a"]["value"] == pytest.approx(2.5 / 25)
    assert p["a", "base"]["low"] <= p["a", "base"]["value"] <= p["a", "base"]["high"]
    # the same input gives the same numbers
    assert cli.main(["compare", str(tmp_path / "a"), f"base={tmp_path}/b/seed-*", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out


def test_compare_prints_a_table_and_draws_the_profiles(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib: pip install 'rlstruct[plot]'")
    _runs(tmp_path / "a", [1.0, 2.0, 3.0])
    _runs(tmp_path / "b", [2.0, 3.0, 4.0])
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--plot", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "IQM [95% CI]" in out and "P(a > b) = 0.22" in out
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_refuses_bad_groups_with_one_line(tmp_path, capsys):
    assert cli.main(["compare", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert cli.main(["compare", str(tmp_path / "empty")]) == 2
    assert "must hold run folders" in capsys.readouterr().err
    (tmp_path / "empty" / "plots").mkdir()  # a folder no run wrote into is no run
    assert cli.main(["compare", str(tmp_path / "empty")]) == 2
    assert "must hold run folders" in capsys.readouterr().err
    _runs(tmp_path / "a", [1.0])
    assert cli.main(["compare", str(tmp_path / "a"), f"a={tmp_path / 'a'}"]) == 2
    assert "labels must differ" in capsys.readouterr().err
    assert cli.main(["compare", str(tmp_path / "a"), "--confidence", "95"]) == 2
    assert "--confidence must lie in (0, 1), got 95.0" in capsys.readouterr().err
    assert cli.main(["compare", str(tmp_path / "a"), "--resamples", "0"]) == 2
    assert "--resamples must be >= 1, got 0" in capsys.readouterr().err


def _unfinished(folder):
    """Five runs of a group, two of them results: one killed before its summary, one interrupted, one diverged."""
    _runs(folder, [500.0, 480.0, 200.0, 450.0, 300.0])
    (folder / "seed-2" / "summary.json").unlink()
    (folder / "seed-3" / "summary.json").write_text(json.dumps({"eval_return": 450.0, "interrupted": True,
                                                                "stop_reason": "signal"}))
    (folder / "seed-4" / "summary.json").write_text(json.dumps({"eval_return": None, "interrupted": False,
                                                                "stop_reason": "diverged"}))


def test_compare_lists_every_run_and_refuses_a_group_with_runs_that_are_not_results(tmp_path, capsys):
    _unfinished(tmp_path / "a")
    _runs(tmp_path / "b", [100.0, 150.0])
    (tmp_path / "b" / "seed-1" / "summary.json").unlink()
    _runs(tmp_path / "c", [1.0, 2.0])
    group = load_group(str(tmp_path / "a"))
    assert group.runs == (str(tmp_path / "a" / "seed-0"), str(tmp_path / "a" / "seed-1"))
    assert group.scores == {"CartPole-v1": [500.0, 480.0]}
    assert dict(group.left_out) == {str(tmp_path / "a" / f"seed-{i}"): state
                                    for i, state in [(2, "no summary"), (3, "interrupted"), (4, "diverged")]}
    with pytest.raises(ConfigError, match=r"GROUP 'a' must hold finished runs only, got 3 that are not: .*seed-2 \(no "
                                          r"summary: crashed, killed or still running\), .*seed-3 \(interrupted\), "
                                          r".*seed-4 \(diverged\); .* pass --allow-missing"):
        compare_groups([group])
    # the command: one line per group refused, naming its runs
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("rlstruct compare: error: GROUP 'a' must hold finished runs only, got 3")
    assert "GROUP 'b'" in err[1] and "seed-1 (no summary" in err[1]
    # --allow-missing: the statistics of the finished runs, and what was left out, counted and listed
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--allow-missing", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    a = out["groups"]["a"]
    assert a["n_left_out"] == 3 and a["left_out"][str(tmp_path / "a" / "seed-4")] == "diverged"
    assert a["scores"] == {"CartPole-v1": [500.0, 480.0]} and a["iqm"]["value"] == 490.0
    assert out["groups"]["b"]["n_left_out"] == 1 and len(out["groups"]["b"]["runs"]) == 1
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "c"), "--allow-missing"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["group", "runs", "left", "out"] and table[1].split()[:3] == ["a", "2", "3"]
    assert f"a: left out {tmp_path / 'a' / 'seed-3'} (interrupted)" in table
    # a group with no finished run has nothing to compute, flag or not
    for seed in (0, 1):
        (tmp_path / "a" / f"seed-{seed}" / "summary.json").unlink()
    with pytest.raises(ConfigError, match="GROUP 'a' must hold a finished run, got none: .*seed-0 \\(no summary"):
        compare_groups([load_group(str(tmp_path / "a"))], allow_missing=True)


@pytest.mark.parametrize("content, found", [
    ("{\"eval_return\": 4", "cannot be read as JSON"),
    ("[1, 2]", "must hold a JSON object, got a list"),
    ("{\"env_steps\": 100}", "finite number in eval_return, got None"),
    ("{\"eval_return\": \"435.06\"}", "finite number in eval_return, got '435.06'"),
    ("{\"eval_return\": NaN}", "finite number in eval_return, got nan"),
    ("{\"eval_return\": Infinity, \"interrupted\": false}", "finite number in eval_return, got inf"),
    ("{\"eval_return\": true}", "finite number in eval_return, got True"),
])
def test_a_damaged_summary_is_one_line_naming_its_file(tmp_path, capsys, content, found):
    _runs(tmp_path / "a", [1.0, 2.0])
    summary = tmp_path / "a" / "seed-1" / "summary.json"
    summary.write_text(content)
    with pytest.raises(RunRecordError, match=found):
        load_group(str(tmp_path / "a"))
    assert cli.main(["compare", str(tmp_path / "a"), "--allow-missing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rlstruct compare: error: {summary} must ") and found in err[0]


def test_a_damaged_config_is_one_line_naming_its_file(tmp_path, capsys):
    _runs(tmp_path / "a", [1.0, 2.0])
    config = tmp_path / "a" / "seed-0" / "config.json"
    config.write_text("{\"env\": ")
    assert cli.main(["compare", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rlstruct compare: error: {config} must be a run's JSON record")


def test_compare_without_scipy_says_which_extra_installs_it_in_one_line(tmp_path, capsys, monkeypatch):
    _runs(tmp_path / "a", [500.0, 480.0])
    for module in ("scipy", "scipy.stats"):  # as where the stats extra is not installed: importing it fails
        monkeypatch.setitem(sys.modules, module, None)
    assert cli.main(["compare", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["rlstruct compare: error: rlstruct compare and rlstruct.algos.statistics need "
                                        "scipy, which is not installed here; pip install 'rlstruct[stats]'"]
