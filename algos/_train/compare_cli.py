"""The ``rlstruct compare`` command: the arguments it shares with ``rlstruct report`` (the groups, the references,
the bootstrap, the normalisation), the groups' comparison (:func:`groups_result`) and the table it prints."""

from __future__ import annotations

import json
import sys
from typing import Any

from rlstruct.algos._train.compare import Group, compare_groups, left_out_reason, load_group
from rlstruct.algos._train.flags import OneLineParser
from rlstruct.algos._train.run_folder import check_output

__all__ = ["add_group_arguments", "compare_main", "compare_table", "groups_result"]


def _interval(d: dict[str, float | None]) -> str:
    low, high = ("-" if v is None else f"{v:.2f}" for v in (d["low"], d["high"]))
    return f"{d['value']:.2f} [{low}, {high}]"


def compare_table(result: dict[str, Any]) -> str:
    """The lines ``rlstruct compare`` prints: a row per group (its counted runs, the runs left out, the aggregates
    and, where its runs logged evaluations, the IQM of their areas under the curve), a line per probability of
    improvement, then a line per run left out and per run counted though it stopped before its budget
    (``--allow-partial``)."""
    level = f"{result['confidence']:.0%} CI"
    normalized = result.get("normalized", False)
    names = ("iqm", "mean", "median", *(("optimality_gap",) if normalized else ()))
    heads = {"iqm": "IQM", "mean": "mean", "median": "median", "optimality_gap": "optimality gap"}
    curves = result.get("curves", {})
    rows = [("group", "runs", "left out", "envs", *(f"{heads[n]} [{level}]" for n in names),
             *((f"AUC IQM [{level}]",) if curves else ()))]
    for label, g in result["groups"].items():
        envs = ", ".join(g["scores"])
        auc = (_interval(curves[label]["auc"]) if label in curves else "-",) if curves else ()
        rows.append((label, str(len(g["runs"])), str(g["n_left_out"]), envs, *(_interval(g[k]) for k in names), *auc))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if normalized:
        lines.append("scores normalised per env: (return - random) / (reference - random)")
    lines += [f"P({p['x']} > {p['y']}) = {_interval(p)}" for p in result["improvement"]]
    for label, g in result["groups"].items():
        stopped = g.get("stopped_early", {})
        lines += [f"{label}: left out {run} ({left_out_reason(state, stopped.get(run))})"
                  for run, state in g["left_out"].items()]
        lines += [f"{label}: counted {run}, which {stopped[run]} (--allow-partial)" for run in g["runs"]
                  if run in stopped]
    return "\n".join(lines)


def _checked_options(ns: Any) -> None:
    if not 0 < ns.confidence < 1:
        raise ValueError(f"--confidence must lie in (0, 1), got {ns.confidence}; pass e.g. 0.95")
    if ns.resamples < 1:
        raise ValueError(f"--resamples must be >= 1, got {ns.resamples}; pass e.g. 2000")


def add_group_arguments(parser: Any) -> None:
    """The arguments ``rlstruct compare`` and ``rlstruct report`` share: the groups, the references, the bootstrap,
    the normalisation and what a group may hold."""
    parser.add_argument("groups", nargs="*", metavar="GROUP",
                        help="[LABEL=]PATH: a folder holding one run folder per seed, or a quoted glob of run folders")
    parser.add_argument("--reference", action="append", default=[], metavar="[LABEL=]NAME|PATH[,...]",
                        help="also a group of recorded runs: a name the package ships (e.g. ppo-cartpole) or a "
                             "records file (benchmarks/published.py --pack); several, comma-separated, make one group")
    parser.add_argument("--normalize", nargs="?", const="shipped", default=None, metavar="FILE",
                        help="normalise each env's returns by a random and a reference score: the package's table, "
                             "or FILE's (JSON: env -> {random, reference})")
    parser.add_argument("--confidence", type=float, default=0.95, metavar="LEVEL",
                        help="confidence level (default: 0.95)")
    parser.add_argument("--resamples", type=int, default=2000, metavar="N", help="bootstrap resamples (default: 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the resampling (default: 0)")
    parser.add_argument("--allow-missing", action="store_true",
                        help="compare the finished runs of groups that hold runs stopped before their budget, "
                             "diverged or crashed (default: refuse); the count left out is reported")
    parser.add_argument("--allow-partial", action="store_true",
                        help="count the runs stopped before their step budget (time limit, signal, worker failure) "
                             "at their last evaluation (default: not results); each is named")
    parser.add_argument("--allow-mixed", action="store_true",
                        help="pool runs of several algorithms or envs, or repeated seeds, in a group (default: refuse)")


def groups_result(ns: Any) -> tuple[list[Group], dict[str, Any]]:
    """The groups of ``ns`` (:func:`add_group_arguments`) and their :func:`compare_groups` result.

    Raises:
        ValueError: a bad option, group, records file or score table (one line per group refused).
        FileNotFoundError: a GROUP does not exist.
    """
    from rlstruct.algos._train.records import load_reference
    from rlstruct.algos.statistics import load_score_table

    _checked_options(ns)
    if not ns.groups and not ns.reference:
        raise ValueError("GROUP must be given at least once (or --reference), got none; pass e.g. runs/seeds/ppo")
    groups = ([load_group(spec, allow_partial=ns.allow_partial) for spec in ns.groups]
              + [load_reference(spec, allow_partial=ns.allow_partial) for spec in ns.reference])
    table = None if ns.normalize is None else load_score_table(None if ns.normalize == "shipped" else ns.normalize)
    result = compare_groups(groups, confidence=ns.confidence, n_resamples=ns.resamples, seed=ns.seed,
                            allow_missing=ns.allow_missing, allow_mixed=ns.allow_mixed, table=table)
    return groups, result


def compare_main(argv: list[str]) -> int:
    """``rlstruct compare GROUP... [--json] [--plot FILE] [--curves FILE] [--table markdown|latex] [--normalize
    [FILE]] [--reference NAME|PATH] [--allow-missing] [--allow-partial] [--allow-mixed]``: prints the table (or,
    with ``--json``, the JSON object alone; with ``--table``, the Markdown or LaTeX table alone); a bad GROUP prints
    one line to stderr (one per group refused) and returns 2."""
    from rlstruct.algos._train.figures import TABLE_FORMATS, plot_curves, render_table

    parser = OneLineParser(prog="rlstruct compare",
                           description="IQM, mean and median of the final evaluation returns of groups of runs, with "
                                       "stratified bootstrap confidence intervals, the probability of improvement "
                                       "between groups, and their learning curves over seeds.")
    add_group_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the statistics as one JSON object only")
    parser.add_argument("--plot", default=None, metavar="FILE",
                        help="also draw the groups' performance profiles into FILE, a PNG or SVG (matplotlib)")
    parser.add_argument("--curves", default=None, metavar="FILE",
                        help="also draw each group's IQM evaluation return against env steps, with its interval, "
                             "into FILE, a PNG or SVG (matplotlib)")
    parser.add_argument("--curves-mean", action="store_true",
                        help="also draw each group's mean beside its IQM (dotted) in --curves")
    parser.add_argument("--table", default=None, choices=TABLE_FORMATS,
                        help="print the per-group and per-env table as Markdown or a LaTeX (booktabs) table body")
    ns = parser.parse_args(argv)
    try:
        for flag in ("plot", "curves"):  # never a run's own file: the curve, the checkpoint
            check_output(getattr(ns, flag), argument=f"--{flag}")
        groups, result = groups_result(ns)
        if ns.plot is not None:
            from rlstruct.algos.statistics import plot_performance_profiles

            scored = {g: r.get("normalized_scores", r["scores"]) for g, r in result["groups"].items()}
            xlabel = "normalised score" if result["normalized"] else "evaluation return"
            result["plot"] = str(plot_performance_profiles(scored, ns.plot, xlabel=xlabel))
        if ns.curves is not None:
            result["curves_plot"] = str(plot_curves(result, ns.curves, mean=ns.curves_mean))
    except (ValueError, ImportError, FileNotFoundError) as e:  # ConfigError and MissingDependencyError among them
        for line in str(e).splitlines():  # a line per group refused
            print(f"rlstruct compare: error: {line}", file=sys.stderr)
        return 2
    if ns.json:
        print(json.dumps(result))
    elif ns.table is not None:
        print(render_table(result, ns.table))
    else:
        print(compare_table(result))
        if ns.plot is not None:
            print(f"performance profiles: {result['plot']}")
        if ns.curves is not None:
            print(f"curves: {result['curves_plot']}")
    return 0
