"""What ``rlstruct compare`` and ``rlstruct report`` print and draw from names the runs give (a group's label, an env
id from a run's config.json, a run's folder), each escaped for where it lands: LaTeX, Markdown, HTML, matplotlib's
text; ``--reference`` names confined to the shipped ones; only a finished run counted as a result (a run cut by a
time limit is named and left out, or counted with ``--allow-partial``); and a group over envs of other budgets pooled
over the fraction of each env's budget."""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("scipy.stats", reason="rlstruct compare needs scipy: pip install 'rlstruct[stats]'")

from rlstruct.algos._train import cli  # noqa: E402
from rlstruct.algos._train.compare import compare_groups, load_group  # noqa: E402
from rlstruct.algos._train.figures import _LATEX, latex_text, markdown_text, render_table  # noqa: E402
from rlstruct.algos.statistics import iqm  # noqa: E402
from rlstruct.errors import ConfigError  # noqa: E402

#: the name of the issue: a LaTeX command, and a file to read into the paper
INJECTION = "x\\scriptsize\\input{/etc/hostname}"
#: names that break a format they are not escaped for
HOSTILE = [INJECTION, "a|b", "<script>alert(1)</script>", "$\\frac{$", "50% & #1 ~^_{}", "two\nlines", 'q"uote\'s']

#: LaTeX text in which no command, group, math or table cell can start: each special character only as its escape
_LATEX_TEXT = re.compile("(?:" + "|".join(map(re.escape, _LATEX.values()))
                         + "|[^\\\\{}$&#^_%~<>|\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029])*")


def _run(folder, *, env="CartPole-v1", algo="ppo", seed=0, score=100.0, steps=100_352, budget=100_000,
         reason="budget", curve=None, **summary):
    """One run folder as a run writes it: config.json, summary.json and, given ``curve`` (``[(env_steps, return)]``),
    the evaluation rows of progress.csv."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"algo": algo, "env": env, "seed": seed,
                                                     "max_env_steps": budget}))
    (folder / "summary.json").write_text(json.dumps({"eval_return": score, "env_steps": steps, "stop_reason": reason,
                                                      "interrupted": reason == "signal", **summary}))
    if curve is not None:
        rows = ["iteration,env_steps,wall_time_s,eval/return,eval/launch_env_steps,eval/confirmation"]
        rows += [f"{k},{s},0.1,{r},{s},0.0" for k, (s, r) in enumerate(curve)]
        (folder / "progress.csv").write_text("\n".join(rows) + "\n")


def _json(capsys):
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


# --------------------------------------------------------------------------- LaTeX and Markdown
@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_escaped_for_latex_holds_no_command_but_the_escapes(name):
    escaped = latex_text(name)
    assert _LATEX_TEXT.fullmatch(escaped), escaped
    # the escapes undone give the text back, control characters and line breaks as spaces: nothing else is changed
    undone = re.sub("|".join(map(re.escape, _LATEX.values())), lambda m: {v: k for k, v in _LATEX.items()}[m.group()],
                    escaped)
    assert undone == re.sub("[\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]", " ", name)
    assert len(escaped.splitlines()) <= 1


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_escaped_for_markdown_holds_no_raw_pipe_html_or_line_break(name):
    escaped = markdown_text(name)
    assert not re.search("[<>\\n\\r]", escaped) and len(escaped.splitlines()) <= 1
    # every | and \ comes escaped by a backslash: read pairs left to right, none is left alone
    assert re.fullmatch(r"(?:\\[\\`*_\[\]|~]|[^\\|])*", escaped), escaped
    assert "&" not in re.sub(r"&(?:amp|lt|gt);", "", escaped)


def _result(label, env):
    """A comparison's result of one group ``label`` of three runs of ``env`` (no curves)."""
    interval = {"value": 1.0, "low": 0.5, "high": 1.5}
    return {"confidence": 0.95, "normalized": False, "curves": {}, "improvement": [],
            "groups": {label: {"runs": ["r0", "r1", "r2"], "iqm": interval, "mean": interval, "median": interval,
                               "envs": {env: {"runs": 3, "iqm": interval, "mean": interval, "median": interval}}}}}


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1), st.text(min_size=1))
def test_every_cell_of_the_tables_from_a_name_is_escaped(label, env):
    """LaTeX: a row's cells are the escaped names and the intervals, the only commands those the table adds;
    Markdown: a row has as many unescaped pipes as the table has columns, plus one."""
    tex = render_table(_result(label, env), "latex")
    rows = [line for line in tex.splitlines() if line.endswith(" \\\\") and not line.startswith("group & ")
            and not line.startswith("env & ")]
    assert [r.split(" & ")[0] for r in rows] == [latex_text(label), latex_text(env)]
    assert rows[1].split(" & ")[1] == latex_text(label)
    commands = set(re.findall(r"\\[a-zA-Z]+", re.sub("|".join(map(re.escape, _LATEX.values())), "", tex)))
    assert commands <= {"\\begin", "\\end", "\\toprule", "\\midrule", "\\bottomrule", "\\scriptsize"}, commands
    md = render_table(_result(label, env), "markdown")
    rows = [line for line in md.split("\n") if line.startswith("|")]
    group_table, env_table = rows[:3], rows[3:]
    for lines, columns in ((group_table, 5), (env_table, 6)):
        assert [len(re.findall(r"(?<!\\)(?:\\\\)*\|", line)) for line in lines] == [columns + 1] * 3, lines


def test_the_issues_name_reaches_the_latex_table_as_text(tmp_path, capsys):
    for seed in (0, 1):
        _run(tmp_path / "g" / f"seed-{seed}", env=INJECTION, seed=seed)
    assert cli.main(["compare", f"{INJECTION}={tmp_path / 'g'}", "--table", "latex", "--resamples", "50"]) == 0
    tex = capsys.readouterr().out
    assert "\\scriptsize\\input" not in tex and "\\input{" not in tex
    assert "x\\textbackslash{}scriptsize\\textbackslash{}input\\{/etc/hostname\\} & 2 & " in tex
    assert cli.main(["compare", f"a|b<i>={tmp_path / 'g'}", "--table", "markdown", "--resamples", "50"]) == 0
    md = capsys.readouterr().out
    assert "| a\\|b&lt;i&gt; | 2 | " in md and "<i>" not in md


@pytest.mark.skipif(shutil.which("pdflatex") is None,
                    reason="pdflatex is not installed (make docs-deps installs Debian's texlive-latex-recommended)")
def test_a_paper_with_the_hostile_names_compiles_and_reads_no_file(tmp_path):
    """Each hostile name as a group and as an env, pasted into a paper: pdflatex compiles it, and opens no file the
    names named (its log lists every file it read)."""
    tex = "".join(render_table(_result(name, name), "latex") for name in HOSTILE)
    paper = tmp_path / "paper.tex"
    paper.write_text("\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n" + tex
                     + "\n\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape", paper.name],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "/etc/hostname" not in (tmp_path / "paper.log").read_text().replace("\n", "")


# --------------------------------------------------------------------------- HTML and matplotlib
@pytest.mark.slow  # two figures drawn as SVG
def test_the_report_escapes_every_name_and_its_figures_draw_them_as_text(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="rlstruct report draws with matplotlib: pip install 'rlstruct[plot]'")
    label, env = "<script>alert(1)</script>$x^2$", '<script src="x">"$\\frac{$'
    for seed in (0, 1):
        _run(tmp_path / "<b>g" / f"<i>seed-{seed}", env=env, algo="<script>", seed=seed,
             curve=[(0, 1.0 + seed), (50_000, 2.0), (100_000, 3.0)])
    page = tmp_path / "report.html"
    assert cli.main(["report", f"{label}={tmp_path / '<b>g'}", "--resamples", "50", "--output", str(page)]) == 0
    html = page.read_text()
    assert "<script" not in html.lower() and "<b>" not in html and "<i>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;$x^2$" in html  # the tables, escaped and whole
    # the figures' words (SVG text): the label as it is, not typeset as math
    assert "&lt;script&gt;alert(1)&lt;/script&gt;$x^2$ (IQM of 2 runs)" in html
    assert html.count("<svg") == 2


def test_the_figures_draw_a_name_that_is_bad_mathtext_as_text(tmp_path):
    """Unescaped, ``$\\frac{$`` is mathtext that matplotlib cannot parse (the figure fails); escaped, it is text."""
    pytest.importorskip("matplotlib", reason="the plots need matplotlib: pip install 'rlstruct[plot]'")
    from rlstruct.algos._train.figures import learning_curve_png
    from rlstruct.algos.statistics import plot_performance_profiles

    name = "$\\frac{$"
    png = learning_curve_png([{"env_steps": 0, "wall_time_s": 0.1, "eval/return": 1.0}], f"PPO on {name}")
    assert png is not None and png[:4] == b"\x89PNG"
    svg = tmp_path / "p.svg"
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none", "text.usetex": True}):  # a user's rc: no LaTeX pass either
        plot_performance_profiles({name: [1.0, 2.0], "<b>": [2.0, 3.0]}, svg)
    text = svg.read_text()
    assert "$\\frac{$" in text and "&lt;b&gt;" in text and "<b>" not in text


# --------------------------------------------------------------------------- --reference names
def test_a_reference_name_reaches_only_the_shipped_records(tmp_path, capsys):
    from rlstruct.algos._train.records import load_reference, shipped_references

    shipped = shipped_references()
    # ../score_table is a JSON file beside the shipped records: a name, not a path, never reads it
    for name in ("../x", "../score_table", "ppo-cartpole/../ppo-acrobot", "nope"):
        with pytest.raises(ConfigError, match=r"--reference must be a records file or a shipped name \("
                                              + re.escape(", ".join(shipped)) + rf"\), got {re.escape(repr(name))}"):
            load_reference(name)
    assert cli.main(["compare", "--reference", "../x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ppo-cartpole" in err[0] and "got '../x'" in err[0]
    assert load_reference("ppo-cartpole").reference == "ppo-cartpole"


# --------------------------------------------------------------------------- only a finished run is a result
def test_no_wall_clock_limit_by_default_nor_in_a_preset():
    from rlstruct.algos._env_spec import EnvSpec
    from rlstruct.algos._train.config import RunConfig
    from rlstruct.algos._train.presets import PRESETS
    from rlstruct.algos._train.stop_rule import StopRule
    from rlstruct.algos.a2c import A2CConfig
    from rlstruct.algos.dqn import DQNConfig
    from rlstruct.algos.sac import SACConfig

    assert RunConfig().time_limit is None
    assert A2CConfig().time_limit is None and DQNConfig().time_limit is None and SACConfig().time_limit is None
    assert [p.name for p in PRESETS if "time_limit" in p.settings] == []
    rule = StopRule(RunConfig(max_env_steps=100), EnvSpec((4,), "float32", 2, 500, 475.0), clock=lambda: 1e12)
    assert not rule.should_stop(99) and rule.should_stop(100) and rule.reason == "budget"


def test_a_run_cut_by_its_time_limit_says_where_it_stopped():
    from rlstruct.algos._train.result import TrainResult
    from rlstruct.algos._train.train_command import stop_line
    from rlstruct.algos.a2c import A2CConfig

    cut = TrainResult(eval_return=9.4, env_steps=0, wall_time_s=60.0, history=[], logdir="runs/x",
                      stop_reason="time_limit", max_env_steps=100_000)
    assert cut.summary()["stopped_early"] == "stopped at 0 of 100,000 env steps (its time limit)"
    assert stop_line(cut, A2CConfig(time_limit=60.0, max_env_steps=100_000)).startswith(
        "stopped at 0 of 100,000 env steps: time limit of 60 s reached; not a result")
    done = TrainResult(eval_return=500.0, env_steps=100_352, wall_time_s=60.0, history=[], logdir="runs/x",
                       max_env_steps=100_000)
    assert done.summary()["stopped_early"] is None


def _cut_group(folder):
    """Three runs of one group: two spent their budget, one its time limit at 0 env steps (its untrained 9.4)."""
    _run(folder / "seed-0", seed=0, score=500.0)
    _run(folder / "seed-1", seed=1, score=480.0)
    _run(folder / "seed-2", seed=2, score=9.4, steps=0, reason="time_limit")


def test_a_run_cut_by_a_time_limit_is_left_out_naming_where_or_counted_with_allow_partial(tmp_path, capsys):
    _cut_group(tmp_path / "a")
    cut = tmp_path / "a" / "seed-2"
    where = "stopped at 0 of 100,000 env steps (its time limit)"
    group = load_group(str(tmp_path / "a"))
    assert group.left_out == ((str(cut), "partial"),) and group.stopped_early == {str(cut): where}
    with pytest.raises(ConfigError, match=rf"GROUP 'a' must hold finished runs only, got 1 that are not: .*seed-2 "
                                          rf"\({re.escape(where)}\); .*or --allow-partial to count"):
        compare_groups([group])
    assert cli.main(["compare", str(tmp_path / "a")]) == 2
    assert where in capsys.readouterr().err
    # left out, named, and the statistics of the finished runs
    assert cli.main(["compare", str(tmp_path / "a"), "--allow-missing", "--resamples", "50"]) == 0
    assert f"a: left out {cut} ({where})" in capsys.readouterr().out.splitlines()
    assert cli.main(["compare", str(tmp_path / "a"), "--allow-missing", "--json", "--resamples", "50"]) == 0
    a = _json(capsys)["groups"]["a"]
    assert a["scores"] == {"CartPole-v1": [500.0, 480.0]} and a["left_out"] == {str(cut): "partial"}
    assert a["stopped_early"] == {str(cut): where}
    # counted as asked, and named so
    assert cli.main(["compare", str(tmp_path / "a"), "--allow-partial", "--resamples", "50"]) == 0
    assert f"a: counted {cut}, which {where} (--allow-partial)" in capsys.readouterr().out.splitlines()
    assert cli.main(["compare", str(tmp_path / "a"), "--allow-partial", "--json", "--resamples", "50"]) == 0
    a = _json(capsys)["groups"]["a"]
    assert a["scores"] == {"CartPole-v1": [500.0, 480.0, 9.4]} and a["n_left_out"] == 0


def test_the_report_leaves_out_a_run_cut_by_a_time_limit_with_the_reason(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="rlstruct report draws with matplotlib: pip install 'rlstruct[plot]'")
    _cut_group(tmp_path / "a")
    page = tmp_path / "r.html"
    assert cli.main(["report", str(tmp_path / "a"), "--resamples", "50", "--output", str(page)]) == 2
    assert "stopped at 0 of 100,000 env steps (its time limit)" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path / "a"), "--allow-missing", "--resamples", "50", "--output",
                     str(page)]) == 0
    assert "left out: stopped at 0 of 100,000 env steps (its time limit)" in page.read_text()
    assert cli.main(["report", str(tmp_path / "a"), "--allow-partial", "--resamples", "50", "--output",
                     str(page)]) == 0
    assert "counted (--allow-partial): stopped at 0 of 100,000 env steps (its time limit)" in page.read_text()


def test_records_judge_a_run_again_by_its_summary(tmp_path):
    """A run packed as finished before a time limit counted against it, and one packed now, are left out alike."""
    from rlstruct.algos._train.records import load_reference, pack_runs, write_records

    _cut_group(tmp_path / "a")
    records = pack_runs(tmp_path / "a", name="a")
    assert [r["state"] for r in records["runs"]] == ["finished", "finished", "partial"]
    for state in ("partial", "finished"):
        records["runs"][2]["state"] = state
        path = write_records(records, tmp_path / f"{state}.json")
        group = load_reference(str(path))
        assert group.left_out == (("a/seed-2", "partial"),) and group.scores == {"CartPole-v1": [500.0, 480.0]}
        assert group.stopped_early == {"a/seed-2": "stopped at 0 of 100,000 env steps (its time limit)"}
        assert load_reference(str(path), allow_partial=True).scores == {"CartPole-v1": [500.0, 480.0, 9.4]}


def test_the_published_table_names_a_run_cut_by_a_time_limit_and_resumes_it(tmp_path):
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    try:
        from benchmarks import published
    finally:
        sys.path.remove(str(root))
    group = tmp_path / "sb3-ppo-halfcheetah-zoo"
    for seed, steps, reason in ((0, 1_000_000, "budget"), (1, 1_000_000, "budget"), (2, 40_960, "time_limit")):
        _run(group / f"seed-{seed}", env="HalfCheetah-v4", algo="sb3-ppo", seed=seed, score=5000.0 + seed,
             steps=steps, budget=1_000_000, reason=reason)
    assert [published.run_state(group / f"seed-{s}") for s in range(3)] == ["finished", "finished", "new"]
    row = published.row_cells(tmp_path, "halfcheetah-zoo", "sb3-ppo")
    assert row[3] == "2 (left out: seed-2 stopped at 40,960 of 1,000,000 env steps (its time limit))", row


@pytest.mark.parametrize("summary, state, where", [
    ({"stop_reason": "time_limit", "env_steps": 2048}, "partial", "stopped at 2,048 of 100,000 env steps (its time "
                                                                  "limit)"),
    ({"stop_reason": "another_rank", "env_steps": 2048}, "partial", "stopped at 2,048 of 100,000 env steps (another "
                                                                    "rank stopped it)"),
    ({"stop_reason": "another_rank", "env_steps": 100_352}, "finished", None),
    ({"stop_reason": "target", "env_steps": 2048}, "finished", None),
    ({"stop_reason": "signal", "interrupted": True, "env_steps": 2048}, "interrupted", "stopped at 2,048 of 100,000 "
                                                                                      "env steps (a signal)"),
    ({"stop_reason": "worker_failed", "env_steps": 2048}, "interrupted", "stopped at 2,048 of 100,000 env steps (a "
                                                                         "batcher worker failed)"),
])
def test_the_state_of_a_run_by_why_and_where_it_stopped(summary, state, where):
    from rlstruct.algos._train.compare import record_state

    assert record_state({"eval_return": 1.0, **summary}, {"max_env_steps": 100_000}) == (state, 1.0, where)
    no_budget = record_state({"eval_return": 1.0, "stop_reason": "time_limit", "env_steps": 2048}, {})
    assert no_budget == ("partial", 1.0, "stopped at 2,048 env steps, with no step budget (its time limit)")


# --------------------------------------------------------------------------- pooled curves
def test_a_group_over_envs_of_other_budgets_is_pooled_over_each_envs_whole_budget(tmp_path, capsys):
    """CartPole's runs over 100k env steps, MinAtar's over 300k: the pooled curve reads each env's runs at the same
    fractions of its own budget up to 1, so MinAtar counts past 100k, and the AUC is the area under that curve."""
    fractions = [0.0, 0.25, 0.5, 0.75, 1.0]
    cartpole = [[0.0, 0.5, 1.0, 1.0, 1.0], [0.0, 0.25, 0.5, 0.75, 1.0]]
    minatar = [[0.0, 0.0, 0.0, 0.5, 1.0], [0.0, 0.0, 0.25, 0.5, 1.0]]  # nothing learnt by 100k of its 300k
    for i, values in enumerate(cartpole):
        _run(tmp_path / "m" / f"cartpole-{i}", seed=i, score=values[-1], steps=100_000,
             curve=[(f * 100_000, v) for f, v in zip(fractions, values)])
    for i, values in enumerate(minatar):
        _run(tmp_path / "m" / f"minatar-{i}", env="MinAtar/Breakout-v1", seed=i, score=values[-1], steps=300_000,
             budget=300_000, curve=[(f * 300_000, v) for f, v in zip(fractions, values)])
    table = tmp_path / "scores.json"
    table.write_text(json.dumps({"CartPole-v1": {"random": 0, "reference": 1},
                                 "MinAtar/Breakout-v1": {"random": 0, "reference": 1}}))
    svg = tmp_path / "c.svg"
    assert cli.main(["compare", str(tmp_path / "m"), "--normalize", str(table), "--json", "--resamples", "50",
                     "--curves", str(svg)]) == 0
    out = _json(capsys)
    curve = out["curves"]["m"]
    assert curve["env_steps"] is None and curve["budget_fraction"] == fractions and not curve["interpolated"]
    assert curve["budgets"] == {"CartPole-v1": 100_000.0, "MinAtar/Breakout-v1": 300_000.0}
    runs = np.array(cartpole + minatar)
    assert curve["iqm"] == pytest.approx(list(iqm(runs, axis=0)))
    # the AUC: each run's mean over the same fractions, whole budgets, by the trapezoid rule
    areas = ((runs[:, 1:] + runs[:, :-1]) / 2 * 0.25).sum(axis=1)
    assert curve["auc_runs"] == pytest.approx(list(areas)) and curve["auc"]["value"] == pytest.approx(iqm(areas))
    assert "fraction of the env-step budget" in svg.read_text()
    # one env: env steps, and the same points as fractions of its budget
    assert cli.main(["compare", f"c={tmp_path}/m/cartpole-*", "--json", "--resamples", "50"]) == 0
    single = _json(capsys)["curves"]["c"]
    assert single["env_steps"] == [0.0, 25_000.0, 50_000.0, 75_000.0, 100_000.0]
    assert single["budget_fraction"] == fractions
