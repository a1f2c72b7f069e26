import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("scipy.stats", reason="rlstruct compare needs scipy: pip install 'rlstruct[stats]'")

from rlstruct.algos._train import cli  # noqa: E402
from rlstruct.algos._train.compare import compare_groups, load_group  # noqa: E402
from rlstruct.algos.statistics import iqm  # noqa: E402
from rlstruct.errors import ConfigError, RunRecordError  # noqa: E402


def _runs(folder, returns, env="CartPole-v1", *, algo="ppo", seeds=None, curves=None):
    """One run folder per score, as a run writes it; ``curves[i]``: run i's evaluations ``[(env_steps, return)]``,
    written into progress.csv between training rows, as a run interleaves them (with a target's confirmation)."""
    for i, value in enumerate(returns):
        seed = i if seeds is None else seeds[i]
        run = folder / f"seed-{i}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"eval_return": value, "env_steps": 100}))
        (run / "config.json").write_text(json.dumps({"algo": algo, "env": env, "seed": seed}))
        if curves is not None:
            lines = ["iteration,env_steps,wall_time_s,loss/policy,train/episode_return,eval/return,"
                     "eval/launch_env_steps,eval/confirmation"]
            for k, (step, ret) in enumerate(curves[i]):
                lines.append(f"{k + 1},{step + 512},0.1,0.5,12.0,,,")
                lines.append(f"{k + 1},{step + 512},0.2,,,{ret},{step},0.0")
            lines.append(f"{len(curves[i])},{step + 512},0.3,,,{ret + 1000},{step},1.0")  # a confirmation: no point
            (run / "progress.csv").write_text("\n".join(lines) + "\n")


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


@pytest.mark.parametrize("content, says", [
    ("{\"env\": ", "must be a run's JSON record"),
    ("", "must be a run's JSON record"),  # a start killed while it wrote config.json, before it was written whole
    (None, "must be a run's JSON record"),
    ('{"algo": "ppo"}', "must name the run's env in env, got None"),
    ('{"env": ""}', "must name the run's env in env, got ''"),
])
def test_a_damaged_config_is_one_line_naming_its_file(tmp_path, capsys, content, says):
    """A finished run whose config.json does not say its env is never filed under an empty env name."""
    _runs(tmp_path / "a", [1.0, 2.0])
    config = tmp_path / "a" / "seed-0" / "config.json"
    if content is None:
        config.unlink()
    else:
        config.write_text(content)
    with pytest.raises(RunRecordError, match=says):
        load_group(str(tmp_path / "a"))
    assert cli.main(["compare", str(tmp_path / "a"), "--allow-missing"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rlstruct compare: error: {config} {says}")


def test_compare_refuses_a_group_that_mixes_algorithms_envs_or_seeds_in_one_line(tmp_path, capsys):
    _runs(tmp_path / "algos", [1.0, 2.0, 3.0])
    (tmp_path / "algos" / "seed-2" / "config.json").write_text(json.dumps({"algo": "a2c", "env": "CartPole-v1",
                                                                           "seed": 2}))
    _runs(tmp_path / "envs", [1.0, 2.0, -90.0])
    (tmp_path / "envs" / "seed-2" / "config.json").write_text(json.dumps({"algo": "ppo", "env": "Acrobot-v1",
                                                                          "seed": 2}))
    _runs(tmp_path / "copies", [1.0, 1.0, 2.0], seeds=[0, 0, 1])
    _runs(tmp_path / "fine", [1.0, 2.0, 3.0])
    groups = [load_group(str(tmp_path / g)) for g in ("algos", "envs", "copies", "fine")]
    with pytest.raises(ConfigError) as err:
        compare_groups(groups)
    lines = str(err.value).splitlines()
    assert len(lines) == 3
    assert re.match(r"GROUP 'algos' must hold runs of one algorithm and one env with distinct seeds, got 2 algorithms: "
                    r"ppo \(.*algos/seed-0, .*algos/seed-1\); a2c \(.*algos/seed-2\); .*--allow-mixed", lines[0])
    assert "GROUP 'envs'" in lines[1] and "2 envs: CartPole-v1" in lines[1] and "Acrobot-v1 (" in lines[1]
    assert "--normalize to weigh envs alike" in lines[1]
    assert re.search(r"GROUP 'copies' .* got seed 0 of CartPole-v1 2 times \(.*copies/seed-0, .*copies/seed-1\)",
                     lines[2])
    # the command: one line per group refused; --allow-mixed pools them as asked
    assert cli.main(["compare", *(str(tmp_path / g) for g in ("algos", "envs", "copies", "fine"))]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 3 and all(e.startswith("rlstruct compare: error: GROUP '") for e in err_lines)
    assert cli.main(["compare", str(tmp_path / "algos"), str(tmp_path / "copies"), "--allow-mixed", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["groups"]["copies"]["scores"] == {"CartPole-v1": [1.0, 1.0, 2.0]}
    # normalised scores weigh envs alike, so a group over envs is one group then
    assert compare_groups([groups[1]], table={"CartPole-v1": (0.0, 4.0), "Acrobot-v1": (-500.0, -80.0)},
                          n_resamples=50)["normalized"]


def _two_groups(tmp_path):
    """Two groups of three runs with their evaluations: ``a``'s runs share their steps, ``b``'s are evaluated at
    other steps (each offset by 100)."""
    steps = [0, 1000, 2000, 3000]
    a = [[(s, 10.0 * k + i) for k, s in enumerate(steps)] for i in range(3)]
    b = [[(s + 100 * i, 5.0 * k) for k, s in enumerate(steps)] for i in range(3)]
    _runs(tmp_path / "a", [30.0, 31.0, 32.0], curves=a)
    _runs(tmp_path / "b", [15.0, 15.0, 15.0], algo="a2c", curves=b)


def test_compare_gives_each_groups_curve_over_seeds_with_intervals_and_draws_it(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib: pip install 'rlstruct[plot]'")
    _two_groups(tmp_path)
    png, svg = tmp_path / "c.png", tmp_path / "c.svg"
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--curves", str(png), "--json",
                     "--resamples", "300"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    a, b = out["curves"]["a"], out["curves"]["b"]
    # a: the runs' own steps, the IQM of 3 runs (their mean) at each, the confirmation row left out
    assert a["env_steps"] == [0.0, 1000.0, 2000.0, 3000.0] and not a["interpolated"] and a["n_runs"] == 3
    assert a["iqm"] == pytest.approx([1.0, 11.0, 21.0, 31.0])
    assert all(lo <= v <= hi for lo, v, hi in zip(a["low"], a["iqm"], a["high"]))
    # b: from the latest first evaluation (200) to the earliest last one (3000), interpolated
    assert b["interpolated"] and b["env_steps"][0] == 200.0 and b["env_steps"][-1] == 3000.0
    # the area under the curve: each run's mean return over its steps, their IQM with its interval
    assert a["auc"]["value"] == pytest.approx(16.0) and a["auc"]["low"] <= 16.0 <= a["auc"]["high"]
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--curves", str(svg), "--curves-mean"]) == 0
    table = capsys.readouterr().out
    assert "AUC IQM [95% CI]" in table and f"curves: {svg}" in table and "<svg" in svg.read_text()
    assert svg.read_text().count('stroke-dasharray') >= 2  # the means, dotted
    # a run without evaluations has no curve: asked for one, one line names the group
    (tmp_path / "b" / "seed-1" / "progress.csv").unlink()
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--curves", str(png)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlstruct compare: error: --curves needs every group's runs to have "
                                               "evaluated over a shared range of env steps, got for b: no evaluation "
                                               f"rows in the progress.csv of {tmp_path / 'b' / 'seed-1'}")
    # runs that share no range of env steps still compare by their final scores; the reason is in the JSON
    _runs(tmp_path / "far", [1.0, 2.0], curves=[[(0, 1.0), (10, 1.0)], [(20, 2.0), (30, 2.0)]])
    assert cli.main(["compare", str(tmp_path / "far"), "--json", "--resamples", "50"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["curves"] == {} and "must share a range of env steps" in out["no_curves"]["far"]
    assert cli.main(["compare", str(tmp_path / "a"), "--curves", str(tmp_path / "c.pdf")]) == 2
    assert "--curves must name a .png or .svg file" in capsys.readouterr().err


def test_a_damaged_progress_csv_is_one_line_naming_its_file(tmp_path, capsys):
    _runs(tmp_path / "a", [1.0, 2.0], curves=[[(0, 1.0)], [(0, 2.0)]])
    path = tmp_path / "a" / "seed-1" / "progress.csv"
    path.write_text(path.read_text().replace(",2.0,0,0.0", ",oops,0,0.0"))
    with pytest.raises(RunRecordError, match=r"progress.csv must hold a finite number in column 'eval/return', got "
                                             r"'oops' on line 3"):
        load_group(str(tmp_path / "a"))
    assert cli.main(["compare", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_group_over_envs_is_normalised_from_the_shipped_table_or_a_users(tmp_path, capsys):
    from rlstruct.algos.statistics import load_score_table

    _runs(tmp_path / "m" / "cartpole", [475.0, 249.34], seeds=[0, 1])
    _runs(tmp_path / "m" / "acrobot", [-100.0, -298.54], env="Acrobot-v1", seeds=[0, 1])
    assert cli.main(["compare", f"m={tmp_path}/m/*/seed-*", "--normalize", "--json", "--resamples", "200"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    shipped = load_score_table()
    m = out["groups"]["m"]
    assert out["normalized"] and m["normalized_scores"]["CartPole-v1"] == pytest.approx(
        [(x - shipped["CartPole-v1"][0]) / (shipped["CartPole-v1"][1] - shipped["CartPole-v1"][0])
         for x in (475.0, 249.34)])
    assert m["normalized_scores"]["Acrobot-v1"][0] == pytest.approx(1.0)
    assert m["optimality_gap"]["value"] == pytest.approx(np.mean([max(1 - x, 0) for v in m["normalized_scores"].values()
                                                                  for x in v]))
    assert m["envs"]["Acrobot-v1"]["mean"]["value"] == pytest.approx(-199.27)  # per env: the raw returns
    # a user's table; an env without a row is one line naming it
    table = tmp_path / "scores.json"
    table.write_text(json.dumps({"CartPole-v1": {"random": 0, "reference": 500}}))
    assert cli.main(["compare", f"m={tmp_path}/m/*/seed-*", "--normalize", str(table)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rlstruct compare: error: scores of env(s) Acrobot-v1 need a random and a reference score to be "
                   "normalised, got none in the score table; pass --normalize FILE with a row for each"]
    table.write_text(json.dumps({"CartPole-v1": {"random": 0, "reference": 500},
                                 "Acrobot-v1": {"random": -500, "reference": 0}}))
    assert cli.main(["compare", f"m={tmp_path}/m/*/seed-*", "--normalize", str(table)]) == 0
    printed = capsys.readouterr().out
    assert "optimality gap [95% CI]" in printed and "scores normalised per env" in printed


def test_the_tables_a_paper_pastes_markdown_and_latex(tmp_path, capsys):
    _two_groups(tmp_path)
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--table", "markdown",
                     "--resamples", "200"]) == 0
    md = capsys.readouterr().out.splitlines()
    assert md[0] == "| group | runs | IQM | mean | median | AUC (IQM) |" and md[1] == "|---|--:|--:|--:|--:|--:|"
    assert md[2].startswith("| a | 3 | 31.00 [") and md[3].startswith("| b | 3 | 15.00")
    assert "| env | group | runs | IQM | mean | median |" in md and any(r.startswith("| CartPole-v1 | a | 3 |")
                                                                      for r in md)
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--table", "latex",
                     "--resamples", "200"]) == 0
    tex = capsys.readouterr().out
    bodies = re.findall(r"\\begin\{tabular\}\{([lr]+)\}\n(.*?)\\end\{tabular\}", tex, re.S)
    assert len(bodies) == 2
    for spec, body in bodies:  # booktabs rules, every row as wide as the column spec, each ended by \\
        lines = body.strip().splitlines()
        assert lines[0] == "\\toprule" and lines[2] == "\\midrule" and lines[-1] == "\\bottomrule"
        rows = [r for r in lines if not r.startswith("\\") or r.startswith("\\scriptsize")]
        assert rows and all(r.endswith(" \\\\") and r.count(" & ") == len(spec) - 1 for r in rows), rows
    assert "CartPole-v1 & a & 3 & 31.00 {\\scriptsize [" in tex
    assert "group & runs & IQM & mean & median & AUC (IQM)" in tex
    with pytest.raises(SystemExit, match="2"):
        cli.main(["compare", str(tmp_path / "a"), "--table", "html"])
    assert "invalid choice: 'html' (choose from 'markdown', 'latex')" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("pdflatex") is None,
                    reason="pdflatex is not installed (make docs-deps installs Debian's texlive-latex-recommended)")
def test_the_latex_table_compiles_in_a_paper_with_booktabs(tmp_path, capsys):
    """What ``--table latex`` prints, pasted into a document that loads booktabs, compiles with pdflatex."""
    _two_groups(tmp_path)
    assert cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--table", "latex",
                     "--resamples", "200"]) == 0
    paper = tmp_path / "paper.tex"
    paper.write_text("\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n"
                     + capsys.readouterr().out + "\n\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", paper.name], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (tmp_path / "paper.pdf").stat().st_size > 0
    assert "LaTeX Warning" not in done.stdout, done.stdout[-3000:]  # wider than article's text: a paper's choice


def test_runs_packed_into_records_compare_as_the_run_folders_do(tmp_path, capsys):
    from rlstruct.algos._train.records import load_reference, pack_runs, write_records

    _two_groups(tmp_path)
    (tmp_path / "a" / "seed-2" / "summary.json").unlink()  # a run that is no result is packed with its state
    summary = json.loads((tmp_path / "a" / "seed-0" / "summary.json").read_text())
    (tmp_path / "a" / "seed-0" / "summary.json").write_text(json.dumps({**summary, "logdir": str(tmp_path)}))
    records = write_records(pack_runs(tmp_path / "a", name="mine", command="rlstruct train ppo ..."),
                            tmp_path / "mine.json")
    assert str(tmp_path) not in records.read_text()  # no machine paths
    assert [r["state"] for r in json.loads(records.read_text())["runs"]] == ["finished", "finished", "no summary"]
    group = load_reference(str(records))
    assert group.label == "ref:mine" and group.runs == ("mine/seed-0", "mine/seed-1")
    assert group.left_out == (("mine/seed-2", "no summary"),) and group.scores == {"CartPole-v1": [30.0, 31.0]}
    # the same statistics from the records as from the folders
    folders = compare_groups([load_group(str(tmp_path / "a"))], allow_missing=True, n_resamples=100)
    packed = compare_groups([load_reference(f"a={records}")], allow_missing=True, n_resamples=100)
    assert packed["groups"]["a"]["iqm"] == folders["groups"]["a"]["iqm"]
    assert packed["curves"]["a"] == folders["curves"]["a"]
    # on the command line, beside a group of run folders
    assert cli.main(["compare", str(tmp_path / "b"), "--reference", str(records), "--allow-missing", "--json",
                     "--resamples", "100"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["curves"]) == {"b", "ref:mine"} and out["groups"]["ref:mine"]["reference"] == "mine"


def test_the_shipped_reference_runs_load_by_name_and_bad_records_are_one_line(tmp_path, capsys):
    from rlstruct.algos._train.records import load_reference, shipped_references

    assert {"ppo-cartpole", "a2c-cartpole"} <= set(shipped_references())
    ppo = load_reference("ppo-cartpole")
    assert len(ppo.runs) == 3 and ppo.scores == {"CartPole-v1": [500.0, 500.0, 500.0]}
    assert all(len(i.env_steps) >= 20 and i.env_steps[-1] >= 100_000 for i in ppo.infos)
    # several records make one group over envs, which compares normalised
    both = load_reference("ppo=ppo-cartpole,ppo-acrobot")
    assert both.label == "ppo" and set(both.scores) == {"CartPole-v1", "Acrobot-v1"} and len(both.runs) == 6
    assert cli.main(["compare", "--reference", "ppo=ppo-cartpole,ppo-acrobot", "--reference",
                     "a2c=a2c-cartpole,a2c-acrobot"]) == 2
    assert "GROUP 'ppo' must hold runs of one algorithm and one env" in capsys.readouterr().err
    assert cli.main(["compare", "--reference", "ppo=ppo-cartpole,ppo-acrobot", "--reference",
                     "a2c=a2c-cartpole,a2c-acrobot", "--normalize", "--json", "--resamples", "100"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["normalized"] and set(out["curves"]) == {"ppo", "a2c"} and "optimality_gap" in out["groups"]["ppo"]
    with pytest.raises(ConfigError, match=r"--reference must be a records file or a shipped name \(.*ppo-cartpole.*\), "
                                          r"got 'nope'"):
        load_reference("nope")
    bad = tmp_path / "bad.json"
    for content, found in [('{"format": "x"}', "got format 'x'"), ('{"format": "rlstruct.records/1", "runs": []}',
                                                                   "got no runs"),
                           ('{"format": "rlstruct.records/1", "runs": [{"name": "s", "state": "finished"}]}',
                            "finished without a finite eval_return")]:
        bad.write_text(content)
        with pytest.raises(RunRecordError, match=found):
            load_reference(str(bad))
    assert cli.main(["compare", "--reference", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"rlstruct compare: error: {bad} must be a records file")
    assert cli.main(["compare"]) == 2
    assert "GROUP must be given at least once (or --reference)" in capsys.readouterr().err


def test_a_users_runs_overlay_a_published_row_shipped_with_the_package(tmp_path, capsys):
    """The records of a row of docs/benchmarks/published.md ship with the package (PPO on MinAtar Breakout at the
    MinAtar paper's 5M env steps, ``--preset ppo-minatar-5m``): a user's runs on that env compare against it by name,
    the final scores' statistics and the curves over seeds on one figure."""
    pytest.importorskip("matplotlib", reason="the curves need matplotlib: pip install 'rlstruct[plot]'")
    from rlstruct.algos._train.records import load_reference

    published = load_reference("ppo-breakout")
    assert len(published.runs) == 5 and not published.left_out and set(published.scores) == {"MinAtar/Breakout-v1"}
    assert all(i.env_steps[-1] >= 5_000_000 and len(i.env_steps) >= 20 for i in published.infos)
    # three runs of the user's, evaluated every million env steps
    steps = [1_000_000 * k for k in range(6)]
    _runs(tmp_path / "mine", [14.0, 15.0, 18.0], env="MinAtar/Breakout-v1",
          curves=[[(s, 3.0 * k + i) for k, s in enumerate(steps)] for i in range(3)])
    png = tmp_path / "curves.png"
    assert cli.main(["compare", str(tmp_path / "mine"), "--reference", "ppo-breakout", "--curves", str(png),
                     "--json", "--resamples", "200"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["curves"]) == {"mine", "ref:ppo-breakout"} and png.stat().st_size > 0
    ref = out["groups"]["ref:ppo-breakout"]
    assert ref["reference"] == "ppo-breakout" and ref["iqm"]["value"] == pytest.approx(
        iqm(np.asarray(published.scores["MinAtar/Breakout-v1"])))
    assert out["curves"]["ref:ppo-breakout"]["env_steps"][-1] >= 5_000_000
    pairs = {(p["x"], p["y"]) for p in out["improvement"]}
    assert pairs == {("mine", "ref:ppo-breakout"), ("ref:ppo-breakout", "mine")}


def _published():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    try:
        from benchmarks import published
    finally:
        sys.path.remove(str(root))
    return published


def test_published_py_packs_a_group_into_records(tmp_path, capsys):
    published = _published()
    _two_groups(tmp_path)
    assert published.main(["--pack", str(tmp_path / "a"), "--records", str(tmp_path / "out"), "--about", "two",
                           "--command", "rlstruct train ppo"]) == 0
    assert f"records: {tmp_path / 'out' / 'a.json'}" in capsys.readouterr().out
    records = json.loads((tmp_path / "out" / "a.json").read_text())
    assert records["about"] == "two" and len(records["runs"]) == 3 and records["runs"][0]["returns"][0] == 0.0


def test_records_packed_again_keep_the_seeds_that_have_no_folder_here(tmp_path, capsys):
    """A row's seeds run on two machines: the second packs its folders into the first's records. A recorded seed
    without a folder here stays, a folder's finished run replaces the recorded one, a finished run is not replaced by
    one still running; records of another row are refused in one line; ``--replace`` writes the folders' runs
    alone."""
    from rlstruct.algos._train.records import load_reference

    published = _published()
    out, first, second = tmp_path / "out", tmp_path / "first" / "g", tmp_path / "second" / "g"
    args = ["--records", str(out), "--about", "ppo on CartPole", "--command", "c"]
    _runs(first, [10.0, 11.0])
    assert published.main(["--pack", str(first), *args]) == 0
    _runs(second, [20.0, 21.0, 22.0])  # seed 0 run again, seed 1 still running, seed 2 new
    (second / "seed-1" / "summary.json").unlink()
    capsys.readouterr()
    assert published.main(["--pack", str(second), *args]) == 0
    assert "kept the finished seed-1 over its folder's run, which has not finished" in capsys.readouterr().out
    runs = json.loads((out / "g.json").read_text())["runs"]
    assert [(r["name"], r["state"], r["summary"]["eval_return"]) for r in runs] == [
        ("seed-0", "finished", 20.0), ("seed-1", "finished", 11.0), ("seed-2", "finished", 22.0)]
    assert load_reference(str(out / "g.json")).scores == {"CartPole-v1": [20.0, 11.0, 22.0]}
    with pytest.raises(SystemExit):
        published.main(["--pack", str(second), "--records", str(out), "--about", "sac on Pendulum"])
    assert ("records about 'ppo on CartPole', and the runs packed into it 'sac on Pendulum'; seeds of two rows cannot "
            "be merged") in capsys.readouterr().err
    assert json.loads((out / "g.json").read_text())["runs"] == runs  # left as it was
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "g.json").write_text('{"format": "rlstruct.records/1", "runs": [')  # a copy cut short
    with pytest.raises(SystemExit):
        published.main(["--pack", str(second), "--records", str(damaged), "--about", "ppo on CartPole"])
    assert f"{damaged / 'g.json'} must be a run's JSON record" in capsys.readouterr().err
    assert (damaged / "g.json").read_text() == '{"format": "rlstruct.records/1", "runs": ['  # not overwritten
    assert published.main(["--pack", str(second), *args, "--replace"]) == 0
    assert [r["state"] for r in json.loads((out / "g.json").read_text())["runs"]] == ["finished", "no summary",
                                                                                      "finished"]


def test_compare_without_scipy_says_which_extra_installs_it_in_one_line(tmp_path, capsys, monkeypatch):
    _runs(tmp_path / "a", [500.0, 480.0])
    for module in ("scipy", "scipy.stats"):  # as where the stats extra is not installed: importing it fails
        monkeypatch.setitem(sys.modules, module, None)
    assert cli.main(["compare", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["rlstruct compare: error: rlstruct compare, rlstruct report and "
                                        "rlstruct.algos.statistics need scipy, which is not installed here; "
                                        "pip install 'rlstruct[stats]'"]
