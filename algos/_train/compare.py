"""The body of ``rlstruct compare``: groups of run folders read back (:func:`load_group`), their statistics
(:func:`compare_groups`, from :mod:`rlstruct.algos.statistics`) and the table that prints them."""

from __future__ import annotations

import dataclasses
import glob
import itertools
import json
import math
import sys
from pathlib import Path
from typing import Any

from rlstruct.algos._train.flags import OneLineParser
from rlstruct.algos._train.log import Run
from rlstruct.errors import ConfigError

__all__ = ["Group", "compare_groups", "compare_main", "compare_table", "load_group"]


@dataclasses.dataclass(frozen=True)
class Group:
    """The runs of one group: its label, each run's folder and its score (the ``eval_return`` of its
    ``summary.json``: the final evaluation, or that of the weights kept when an evaluation reached the target),
    by env.

    Attributes:
        label: the name the table and the plot give it.
        runs: the run folders, in order.
        scores: env id -> the scores of its runs.
    """

    label: str
    runs: tuple[str, ...]
    scores: dict[str, list[float]]


def _run_folders(spec: str) -> list[Path]:
    """The run folders a GROUP names: the folders holding a ``summary.json`` among a folder's children (or the
    folder itself), or among a glob pattern's matches."""
    if glob.has_magic(spec):
        matches = [Path(p) for p in sorted(glob.glob(spec))]
    else:
        folder = Path(spec)
        if not folder.is_dir():
            raise FileNotFoundError(f"GROUP must be a folder of run folders or a glob pattern, got {spec!r}, which "
                                    "does not exist; pass e.g. runs/ppo-seeds or 'runs/ppo-CartPole-v1-*'")
        matches = [folder] if (folder / Run.SUMMARY_NAME).is_file() else sorted(p for p in folder.iterdir())
    return [p for p in matches if (p / Run.SUMMARY_NAME).is_file()]


def load_group(spec: str) -> Group:
    """Reads the runs of ``spec``: ``[LABEL=]PATH``, PATH a folder holding one run folder per seed (``--logdir
    DIR/seed-0``, ...) or a quoted glob pattern matching run folders; LABEL defaults to PATH's last part.

    Raises:
        FileNotFoundError: PATH does not exist.
        ConfigError: it holds no finished run (a folder with a ``summary.json``), or a run has no finished
            evaluation (an interrupted run with none).
    """
    label, sep, path = spec.partition("=")
    if not sep:
        label, path = Path(spec.rstrip("/")).name or spec, spec
    runs = _run_folders(path)
    if not runs:
        raise ConfigError(f"GROUP {spec!r} must hold run folders with a {Run.SUMMARY_NAME} (finished runs), got "
                          "none; pass the folder whose subfolders are the runs' --logdir")
    scores: dict[str, list[float]] = {}
    for run in runs:
        summary = json.loads((run / Run.SUMMARY_NAME).read_text())
        score = summary.get("eval_return")
        if score is None or not math.isfinite(score):
            raise ConfigError(f"run {str(run)!r} of GROUP {spec!r} must have a finished evaluation, got eval_return "
                              f"{score!r} (an interrupted run); resume it or leave it out of the group")
        config = run / "config.json"
        env = json.loads(config.read_text()).get("env", "") if config.is_file() else ""
        scores.setdefault(env, []).append(float(score))
    return Group(label, tuple(str(r) for r in runs), scores)


def compare_groups(groups: list[Group], *, confidence: float = 0.95, n_resamples: int = 2000,
                   seed: int = 0) -> dict[str, Any]:
    """The statistics of ``groups`` as a JSON-able dict: per group its runs, IQM, mean and median with their
    intervals (``"groups"``), and for every ordered pair of groups the probability of improvement
    (``"improvement"``, a list of ``{"x", "y", "value", "low", "high"}``)."""
    from rlstruct.algos.statistics import aggregate_scores, probability_of_improvement

    labels = [g.label for g in groups]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"GROUP labels must differ, got {labels}; name them, e.g. ppo=runs/a/ppo a2c=runs/b/a2c")
    options = {"confidence": confidence, "n_resamples": n_resamples, "seed": seed}
    out: dict[str, Any] = {"confidence": confidence, "n_resamples": n_resamples, "seed": seed, "groups": {},
                           "improvement": []}
    for g in groups:
        estimates = aggregate_scores(g.scores, **options)
        out["groups"][g.label] = {"runs": list(g.runs), "scores": g.scores,
                                  **{k: v.to_dict() for k, v in estimates.items()}}
    for a, b in itertools.permutations(groups, 2):
        if set(a.scores) & set(b.scores):
            p = probability_of_improvement(a.scores, b.scores, **options)
            out["improvement"].append({"x": a.label, "y": b.label, **p.to_dict()})
    return out


def _interval(d: dict[str, float | None]) -> str:
    low, high = ("-" if v is None else f"{v:.2f}" for v in (d["low"], d["high"]))
    return f"{d['value']:.2f} [{low}, {high}]"


def compare_table(result: dict[str, Any]) -> str:
    """The lines ``rlstruct compare`` prints: a row per group, then a line per probability of improvement."""
    level = f"{result['confidence']:.0%} CI"
    rows = [("group", "runs", "envs", f"IQM [{level}]", f"mean [{level}]", f"median [{level}]")]
    for label, g in result["groups"].items():
        envs = ", ".join(g["scores"])
        rows.append((label, str(len(g["runs"])), envs, *(_interval(g[k]) for k in ("iqm", "mean", "median"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines += [f"P({p['x']} > {p['y']}) = {_interval(p)}" for p in result["improvement"]]
    return "\n".join(lines)


def compare_main(argv: list[str]) -> int:
    """``rlstruct compare GROUP... [--json] [--plot FILE]``: prints the table (or, with ``--json``, the JSON object
    alone); a bad GROUP prints one line to stderr and returns 2."""
    parser = OneLineParser(prog="rlstruct compare",
                           description="IQM, mean and median of the final evaluation returns of groups of runs, with "
                                       "stratified bootstrap confidence intervals, and the probability of improvement "
                                       "between groups.")
    parser.add_argument("groups", nargs="+", metavar="GROUP",
                        help="[LABEL=]PATH: a folder holding one run folder per seed, or a quoted glob of run folders")
    parser.add_argument("--json", action="store_true", help="print the statistics as one JSON object only")
    parser.add_argument("--plot", default=None, metavar="FILE",
                        help="also draw the groups' performance profiles into FILE, a PNG (matplotlib)")
    parser.add_argument("--confidence", type=float, default=0.95, metavar="LEVEL",
                        help="confidence level (default: 0.95)")
    parser.add_argument("--resamples", type=int, default=2000, metavar="N", help="bootstrap resamples (default: 2000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the resampling (default: 0)")
    ns = parser.parse_args(argv)
    try:
        if not 0 < ns.confidence < 1:
            raise ValueError(f"--confidence must lie in (0, 1), got {ns.confidence}; pass e.g. 0.95")
        if ns.resamples < 1:
            raise ValueError(f"--resamples must be >= 1, got {ns.resamples}; pass e.g. 2000")
        groups = [load_group(spec) for spec in ns.groups]
        result = compare_groups(groups, confidence=ns.confidence, n_resamples=ns.resamples, seed=ns.seed)
        if ns.plot is not None:
            from rlstruct.algos.statistics import plot_performance_profiles

            result["plot"] = str(plot_performance_profiles({g.label: g.scores for g in groups}, ns.plot))
    except (ValueError, ImportError, FileNotFoundError) as e:  # ConfigError and MissingDependencyError among them
        print(f"rlstruct compare: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if not ns.json:
        print(compare_table(result))
        if ns.plot is not None:
            print(f"performance profiles: {result['plot']}")
    else:
        print(json.dumps(result))
    return 0
