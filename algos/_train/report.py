"""``rlstruct report GROUP... --output report.html``: one HTML file that opens from disk, with no server and no
network (figures inline as SVG, styles inline, no script): the groups' learning curves over seeds, their
performance profiles, the aggregate statistics and the per-env table with intervals, the probability of
improvement, every run's state, and the command and config that made each run. Every string from the runs (labels,
env ids, folders, configs) is HTML-escaped, and so are the figures' words (SVG text)."""

from __future__ import annotations

import datetime
import html
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from rlstruct import __version__
from rlstruct._plot import pyplot
from rlstruct.algos._train.compare import FINISHED, Group, left_out_reason
from rlstruct.algos._train.compare_cli import add_group_arguments, groups_result
from rlstruct.algos._train.durable import write_whole
from rlstruct.algos._train.figures import format_interval, plot_curves, table_rows
from rlstruct.algos._train.flags import OneLineParser
from rlstruct.algos._train.run_folder import check_output

__all__ = ["render_report", "report_main"]

_STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{border-bottom:1px solid #ccc;padding:0.25em 0.7em;
text-align:right}th:first-child,td:first-child{text-align:left}td.state-finished{color:#176117}
td.state-left{color:#a11}pre{background:#f5f5f5;padding:0.6em;overflow-x:auto;font-size:0.85em}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}figcaption{font-size:0.9em;color:#555}"""


def _svg(draw: Any) -> str:
    """The SVG that ``draw(path)`` writes, inline: matplotlib's file without its XML prologue and its metadata
    (whose URLs would be the page's only links outside it); its words stay text (``svg.fonttype`` none), which the
    browser sets in its own fonts and a reader can search and copy."""
    plt = pyplot()
    with tempfile.TemporaryDirectory() as tmp, plt.rc_context({"svg.fonttype": "none"}):
        path = Path(tmp) / "figure.svg"
        draw(path)
        text = path.read_text()
    return re.sub(r"<metadata>.*?</metadata>", "", text[text.index("<svg"):], flags=re.S)


def _table(heads: list[str], rows: list[list[Any]], *, cls: list[str] | None = None) -> str:
    out = ["<table>", "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in heads) + "</tr>"]
    for i, row in enumerate(rows):
        attr = f' class="{cls[i]}"' if cls else ""
        texts = [c if isinstance(c, str) else format_interval(c) for c in row]
        cells = "".join(f"<td{attr if j == 1 else ''}>{html.escape(t)}</td>" for j, t in enumerate(texts))
        out.append(f"<tr>{cells}</tr>")
    return "\n".join([*out, "</table>"])


def _command(config: dict[str, Any], folder: str) -> str:
    """The ``rlstruct train`` line that names what a run ran; every other setting is in its config."""
    parts = ["rlstruct train", str(config.get("algo", "?")), "--env", str(config.get("env", "?"))]
    for flag, key in (("--preset", "preset"), ("--seed", "seed"), ("--max-env-steps", "max_env_steps")):
        if config.get(key) is not None:
            parts += [flag, str(config[key])]
    return " ".join(parts + ["--logdir", folder])


def _runs_section(groups: list[Group]) -> str:
    out = ["<h2>Runs</h2>"]
    for g in groups:
        source = f"recorded runs {g.reference!r}" if g.reference else "run folders"
        out.append(f"<h3>{html.escape(g.label)} <small>({html.escape(source)})</small></h3>")
        rows, states = [], []
        for info in g.infos:
            state = FINISHED if info.stopped_early is None else f"counted (--allow-partial): {info.stopped_early}"
            rows.append([info.folder, state, info.env, "-" if info.seed is None else str(info.seed),
                         f"{info.score:.2f}", str(len(info.env_steps))])
            states.append("state-finished" if info.stopped_early is None else "state-left")
        for folder, state in g.left_out:
            rows.append([folder, f"left out: {left_out_reason(state, g.stopped_early.get(folder))}", "-", "-", "-",
                         "-"])
            states.append("state-left")
        out.append(_table(["run", "state", "env", "seed", "final evaluation", "evaluations"], rows, cls=states))
        for info in g.infos:
            config = json.dumps(info.config, indent=1, sort_keys=True)
            out.append(f"<details><summary>{html.escape(info.folder)}: command and config</summary>"
                       f"<pre>{html.escape(_command(info.config, info.folder))}</pre>"
                       f"<pre>{html.escape(config)}</pre></details>")
    return "\n".join(out)


def render_report(groups: list[Group], result: dict[str, Any], *, argv: list[str]) -> str:
    """The report page of ``groups`` and their comparison ``result``
    (:func:`~rlstruct.algos._train.compare.compare_groups`), as one HTML document.

    Raises:
        MissingDependencyError: matplotlib is not installed (the figures need it).
    """
    from rlstruct.algos.statistics import plot_performance_profiles

    level = f"{result['confidence']:.0%}"
    normalized = result["normalized"]
    body = [f"<h1>rlstruct report: {html.escape(', '.join(result['groups']))}</h1>",
            f"<p>Made by <code>{html.escape(' '.join(['rlstruct report', *argv]))}</code>, rlstruct {__version__}, "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. Intervals: {level} stratified "
            f"bootstrap over runs ({result['n_resamples']} resamples, seed {result['seed']}).</p>"]
    if normalized:
        body.append("<p>Scores are normalised per env: (return - random) / (reference - random), so that each env "
                    "weighs alike.</p>")
    curves = result["curves"]
    body.append("<h2>Learning curves</h2>")
    if curves:
        shown = {**result, "groups": {k: v for k, v in result["groups"].items() if k in curves}}
        pooled = any(curve["env_steps"] is None for curve in curves.values())
        at = ("each fraction of the env-step budget (a group over several envs reads each env's runs over its own "
              "whole budget)" if pooled else "each env step")
        body.append(f"<figure id=\"curves\">{_svg(lambda p: plot_curves(shown, p, mean=False))}"
                    f"<figcaption>IQM of the evaluation return over the runs at {at}, the interval shaded; "
                    "runs evaluated at other steps are interpolated onto a common grid (the legend says where)."
                    "</figcaption></figure>")
    for label, why in result.get("no_curves", {}).items():
        body.append(f"<p>No curve for {html.escape(label)}: {html.escape(why)}.</p>")
    scored = {g: r.get("normalized_scores", r["scores"]) for g, r in result["groups"].items()}
    xlabel = "normalised score" if normalized else "evaluation return"
    body.append(f"<h2>Performance profiles</h2><figure id=\"profiles\">"
                f"{_svg(lambda p: plot_performance_profiles(scored, p, xlabel=xlabel))}<figcaption>The fraction of "
                "runs whose final score is above each threshold, its interval shaded.</figcaption></figure>")
    heads, rows, env_heads, env_rows = table_rows(result)
    body += ["<h2>Aggregate statistics</h2>", _table(heads, rows)]
    if result["improvement"]:
        items = [f"P({p['x']} > {p['y']}) = {format_interval(p)}" for p in result["improvement"]]
        body.append("<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>")
    body += ["<h2>Per env</h2><p>Final evaluation returns, not normalised.</p>", _table(env_heads, env_rows),
             _runs_section(groups)]
    title = f"rlstruct report: {', '.join(result['groups'])}"
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def report_main(argv: list[str]) -> int:
    """``rlstruct report GROUP... --output FILE [compare's options]``: writes the report page (whole) and prints its
    path; a bad GROUP or option prints one line to stderr (one per group refused) and returns 2."""
    parser = OneLineParser(prog="rlstruct report",
                           description="One HTML page, self-contained, with the learning curves, statistics, tables "
                                       "and runs of groups of runs.")
    add_group_arguments(parser)
    parser.add_argument("--output", required=True, metavar="FILE", help="the HTML file to write, e.g. report.html")
    ns = parser.parse_args(argv)
    try:
        check_output(ns.output, argument="--output")  # never into a run's folder
        if not re.search(r"\.html?$", ns.output, re.IGNORECASE):
            raise ValueError(f"--output must name an .html file, got {ns.output!r}; pass e.g. report.html")
        groups, result = groups_result(ns)
        page = render_report(groups, result, argv=argv)
        output = Path(ns.output)
        if not output.parent.is_dir():
            raise FileNotFoundError(f"--output must be in an existing folder, got {ns.output!r}; create "
                                    f"{str(output.parent)!r} first")
        write_whole(output, page)
    except (ValueError, ImportError, FileNotFoundError) as e:  # ConfigError and MissingDependencyError among them
        for line in str(e).splitlines():
            print(f"rlstruct report: error: {line}", file=sys.stderr)
        return 2
    print(f"report: {output}")
    return 0
