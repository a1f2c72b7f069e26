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
from rlstruct.algos._train.log import Run, earlier_run_files
from rlstruct.errors import ConfigError, RunRecordError

__all__ = ["Group", "check_complete", "compare_groups", "compare_main", "compare_table", "load_group", "run_state"]


#: what a run folder holds, as ``compare`` lists it: only a finished run is a result
FINISHED, INTERRUPTED, DIVERGED, NO_SUMMARY = "finished", "interrupted", "diverged", "no summary"
#: why each state that is not a result is not one, as the listing says it
_WHY = {INTERRUPTED: "interrupted", DIVERGED: "diverged",
        NO_SUMMARY: "no summary: crashed, killed or still running"}


@dataclasses.dataclass(frozen=True)
class Group:
    """The runs of one group: its label, each finished run's folder and its score (the ``eval_return`` of its
    ``summary.json``: the final evaluation, or that of the weights kept when an evaluation reached the target),
    by env, and the run folders that hold no result.

    Attributes:
        label: the name the table and the plot give it.
        runs: the finished runs' folders, in order.
        scores: env id -> the scores of its finished runs.
        left_out: ``(folder, state)`` of each run that is not a result: ``"interrupted"`` (its summary says so, or
            that a worker failed: ``stop_reason`` ``"worker_failed"``), ``"diverged"`` (``stop_reason``),
            ``"no summary"`` (it crashed, was killed, or still runs).
    """

    label: str
    runs: tuple[str, ...]
    scores: dict[str, list[float]]
    left_out: tuple[tuple[str, str], ...] = ()


def _run_folders(spec: str) -> list[Path]:
    """The run folders a GROUP names: the folder itself when it holds a run, else its subfolders that hold one; or a
    glob pattern's matches that hold one. A folder holds a run when a run has written one of its files there (its
    ``config.json`` is the first), whether it finished or not."""
    if glob.has_magic(spec):
        matches = [Path(p) for p in sorted(glob.glob(spec))]
    else:
        folder = Path(spec)
        if not folder.is_dir():
            raise FileNotFoundError(f"GROUP must be a folder of run folders or a glob pattern, got {spec!r}, which "
                                    "does not exist; pass e.g. runs/ppo-seeds or 'runs/ppo-CartPole-v1-*'")
        matches = [folder] if earlier_run_files(folder) else sorted(p for p in folder.iterdir())
    return [p for p in matches if p.is_dir() and earlier_run_files(p)]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        content = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunRecordError(f"{path} must be a run's JSON record, got a file that cannot be read as JSON "
                             f"({str(e).splitlines()[0]}); restore it from the run, or move its run folder out of "
                             "the group") from None
    if not isinstance(content, dict):
        raise RunRecordError(f"{path} must hold a JSON object, got a {type(content).__name__}; restore it from the "
                             "run, or move its run folder out of the group")
    return content


def run_state(run: Path) -> tuple[str, float | None]:
    """What the run folder ``run`` holds, by its ``summary.json``: ``(state, score)``, the score (``eval_return``)
    of a finished run only.

    Raises:
        RunRecordError: its summary cannot be read, or a finished run's ``eval_return`` is missing, not a number or
            not finite.
    """
    path = run / Run.SUMMARY_NAME
    if not path.is_file():
        return NO_SUMMARY, None
    summary = _read_json(path)
    if summary.get("stop_reason") == "diverged":
        return DIVERGED, None
    if summary.get("interrupted") or summary.get("stop_reason") in ("signal", "worker_failed"):
        return INTERRUPTED, None
    score = summary.get("eval_return")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise RunRecordError(f"{path} must hold the run's final evaluation as a finite number in eval_return, got "
                             f"{score!r}; restore it from the run, or move its run folder out of the group")
    return FINISHED, float(score)


def load_group(spec: str) -> Group:
    """Reads the runs of ``spec``: ``[LABEL=]PATH``, PATH a folder holding one run folder per seed (``--logdir
    DIR/seed-0``, ...) or a quoted glob pattern matching run folders; LABEL defaults to PATH's last part. Every run
    folder is accounted for: a finished run's score is read, the others are listed in :attr:`Group.left_out`.

    Raises:
        FileNotFoundError: PATH does not exist.
        ConfigError: it holds no run folder.
        RunRecordError: a run's ``summary.json`` or ``config.json`` cannot be read, or a finished run has no finite
            ``eval_return`` (the message names the file).
    """
    label, sep, path = spec.partition("=")
    if not sep:
        label, path = Path(spec.rstrip("/")).name or spec, spec
    folders = _run_folders(path)
    if not folders:
        raise ConfigError(f"GROUP {spec!r} must hold run folders (each a run's --logdir), got none; pass the folder "
                          "whose subfolders are the runs' --logdir")
    runs: list[str] = []
    scores: dict[str, list[float]] = {}
    left_out: list[tuple[str, str]] = []
    for run in folders:
        state, score = run_state(run)
        if score is None:
            left_out.append((str(run), state))
            continue
        config = run / Run.CONFIG_NAME
        env = _read_json(config).get("env", "") if config.is_file() and config.stat().st_size else ""
        runs.append(str(run))
        scores.setdefault(str(env), []).append(score)
    return Group(label, tuple(runs), scores, tuple(left_out))


def check_complete(groups: list[Group], *, allow_missing: bool = False) -> None:
    """Refuses groups with runs that are not results (by default), or with no finished run at all.

    Raises:
        ConfigError: one line per such group, naming its runs and their states.
    """
    lines = []
    for g in groups:
        listed = ", ".join(f"{run} ({_WHY[state]})" for run, state in g.left_out)
        if not g.runs:
            lines.append(f"GROUP {g.label!r} must hold a finished run, got none: {listed}; finish or resume them")
        elif g.left_out and not allow_missing:
            lines.append(f"GROUP {g.label!r} must hold finished runs only, got {len(g.left_out)} that are not: "
                         f"{listed}; resume or remove them, or pass --allow-missing to compare the finished runs "
                         "(the count left out is reported)")
    if lines:
        raise ConfigError("\n".join(lines))


def compare_groups(groups: list[Group], *, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0,
                   allow_missing: bool = False) -> dict[str, Any]:
    """The statistics of ``groups`` as a JSON-able dict: per group its finished runs, the runs left out with their
    states (``"left_out"``, ``{folder: state}``, and their count, ``"n_left_out"``), IQM, mean and median with their
    intervals (``"groups"``), and for every ordered pair of groups the probability of improvement
    (``"improvement"``, a list of ``{"x", "y", "value", "low", "high"}``).

    Args:
        groups: the groups (:func:`load_group`).
        confidence: the intervals' confidence level.
        n_resamples: the bootstrap's resamples.
        seed: the bootstrap's seed.
        allow_missing: compute over each group's finished runs when some of its runs are not results (else
            refuse: a statistic over the runs that survived is biased).

    Raises:
        ConfigError: labels repeat, or a group holds a run that is not a result (:func:`check_complete`).
    """
    from rlstruct.algos.statistics import aggregate_scores, probability_of_improvement

    labels = [g.label for g in groups]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"GROUP labels must differ, got {labels}; name them, e.g. ppo=runs/a/ppo a2c=runs/b/a2c")
    check_complete(groups, allow_missing=allow_missing)
    options = {"confidence": confidence, "n_resamples": n_resamples, "seed": seed}
    out: dict[str, Any] = {"confidence": confidence, "n_resamples": n_resamples, "seed": seed, "groups": {},
                           "improvement": []}
    for g in groups:
        estimates = aggregate_scores(g.scores, **options)
        out["groups"][g.label] = {"runs": list(g.runs), "scores": g.scores, "n_left_out": len(g.left_out),
                                  "left_out": dict(g.left_out), **{k: v.to_dict() for k, v in estimates.items()}}
    for a, b in itertools.permutations(groups, 2):
        if set(a.scores) & set(b.scores):
            p = probability_of_improvement(a.scores, b.scores, **options)
            out["improvement"].append({"x": a.label, "y": b.label, **p.to_dict()})
    return out


def _interval(d: dict[str, float | None]) -> str:
    low, high = ("-" if v is None else f"{v:.2f}" for v in (d["low"], d["high"]))
    return f"{d['value']:.2f} [{low}, {high}]"


def compare_table(result: dict[str, Any]) -> str:
    """The lines ``rlstruct compare`` prints: a row per group (its finished runs, the runs left out), a line per
    probability of improvement, then a line per run left out."""
    level = f"{result['confidence']:.0%} CI"
    rows = [("group", "runs", "left out", "envs", f"IQM [{level}]", f"mean [{level}]", f"median [{level}]")]
    for label, g in result["groups"].items():
        envs = ", ".join(g["scores"])
        rows.append((label, str(len(g["runs"])), str(g["n_left_out"]), envs,
                     *(_interval(g[k]) for k in ("iqm", "mean", "median"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines += [f"P({p['x']} > {p['y']}) = {_interval(p)}" for p in result["improvement"]]
    lines += [f"{label}: left out {run} ({_WHY[state]})" for label, g in result["groups"].items()
              for run, state in g["left_out"].items()]
    return "\n".join(lines)


def compare_main(argv: list[str]) -> int:
    """``rlstruct compare GROUP... [--json] [--plot FILE] [--allow-missing]``: prints the table (or, with ``--json``,
    the JSON object alone); a bad GROUP prints one line to stderr (one per group refused) and returns 2."""
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
    parser.add_argument("--allow-missing", action="store_true",
                        help="compare the finished runs of groups that hold interrupted, diverged or crashed runs "
                             "(default: refuse); the count left out is reported")
    ns = parser.parse_args(argv)
    try:
        if not 0 < ns.confidence < 1:
            raise ValueError(f"--confidence must lie in (0, 1), got {ns.confidence}; pass e.g. 0.95")
        if ns.resamples < 1:
            raise ValueError(f"--resamples must be >= 1, got {ns.resamples}; pass e.g. 2000")
        groups = [load_group(spec) for spec in ns.groups]
        result = compare_groups(groups, confidence=ns.confidence, n_resamples=ns.resamples, seed=ns.seed,
                                allow_missing=ns.allow_missing)
        if ns.plot is not None:
            from rlstruct.algos.statistics import plot_performance_profiles

            result["plot"] = str(plot_performance_profiles({g.label: g.scores for g in groups}, ns.plot))
    except (ValueError, ImportError, FileNotFoundError) as e:  # ConfigError and MissingDependencyError among them
        for line in str(e).splitlines():  # a line per group refused
            print(f"rlstruct compare: error: {line}", file=sys.stderr)
        return 2
    if not ns.json:
        print(compare_table(result))
        if ns.plot is not None:
            print(f"performance profiles: {result['plot']}")
    else:
        print(json.dumps(result))
    return 0
