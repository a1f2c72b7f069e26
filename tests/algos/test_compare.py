import json

import pytest

pytest.importorskip("scipy.stats", reason="rlstruct compare needs scipy: pip install 'rlstruct[stats]'")

from rlstruct.algos import cli  # noqa: E402
from rlstruct.algos._train.compare import load_group  # noqa: E402
from rlstruct.algos.statistics import iqm  # noqa: E402
from rlstruct.errors import ConfigError  # noqa: E402


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
    _runs(tmp_path / "a", [1.0])
    assert cli.main(["compare", str(tmp_path / "a"), f"a={tmp_path / 'a'}"]) == 2
    assert "labels must differ" in capsys.readouterr().err
    assert cli.main(["compare", str(tmp_path / "a"), "--confidence", "95"]) == 2
    assert "--confidence must lie in (0, 1), got 95.0" in capsys.readouterr().err
    assert cli.main(["compare", str(tmp_path / "a"), "--resamples", "0"]) == 2
    assert "--resamples must be >= 1, got 0" in capsys.readouterr().err
    _runs(tmp_path / "cut", [float("nan")])
    with pytest.raises(ConfigError, match="must have a finished evaluation"):
        load_group(str(tmp_path / "cut"))
