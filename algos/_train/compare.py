"""What ``rlstruct compare`` computes: groups of run folders read back (:func:`load_group`), checked (finished runs,
one algorithm, one env, distinct seeds) and their statistics (:func:`compare_groups`, from
:mod:`rlstruct.algos.statistics` and :mod:`rlstruct.algos.statistics`). The command and its table are
:mod:`~rlstruct.algos._train.compare_cli`; the figures, Markdown and LaTeX tables :mod:`~rlstruct.algos._train.figures`;
the report page :mod:`~rlstruct.algos._train.report`."""

from __future__ import annotations

import csv
import dataclasses
import glob
import itertools
import json
import math
from pathlib import Path
from typing import Any

from rlstruct.algos._train.run_folder import CONFIG_NAME, CSV_NAME, SUMMARY_NAME, earlier_run_files
from rlstruct.errors import ConfigError, RunRecordError

__all__ = ["Group", "RunInfo", "check_complete", "check_uniform", "compare_groups", "load_group", "make_group",
           "read_evaluations", "read_json_record", "run_env", "run_folders", "run_state"]


#: what a run folder holds, as ``compare`` lists it: only a finished run is a result
FINISHED, INTERRUPTED, DIVERGED, NO_SUMMARY = "finished", "interrupted", "diverged", "no summary"
#: why each state that is not a result is not one, as the listing says it
WHY_LEFT_OUT = {INTERRUPTED: "interrupted", DIVERGED: "diverged",
        NO_SUMMARY: "no summary: crashed, killed or still running"}


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a finished run of a group is: its folder, what its ``config.json`` says it ran, its score and its
    evaluations (``env_steps``, ``returns``: the periodic evaluations of ``progress.csv``, in order; empty when it
    logged none)."""

    folder: str
    algo: str
    env: str
    seed: int | None
    score: float
    env_steps: tuple[float, ...] = ()
    returns: tuple[float, ...] = ()
    config: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)


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
        infos: each finished run's :class:`RunInfo`, in the order of ``runs``.
        reference: the name of the records it was read from (``--reference``), None for run folders.
    """

    label: str
    runs: tuple[str, ...]
    scores: dict[str, list[float]]
    left_out: tuple[tuple[str, str], ...] = ()
    infos: tuple[RunInfo, ...] = ()
    reference: str | None = None


def run_folders(spec: str) -> list[Path]:
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


def read_json_record(path: Path) -> dict[str, Any]:
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
    path = run / SUMMARY_NAME
    if not path.is_file():
        return NO_SUMMARY, None
    summary = read_json_record(path)
    if summary.get("stop_reason") == "diverged":
        return DIVERGED, None
    if summary.get("interrupted") or summary.get("stop_reason") in ("signal", "worker_failed"):
        return INTERRUPTED, None
    score = summary.get("eval_return")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise RunRecordError(f"{path} must hold the run's final evaluation as a finite number in eval_return, got "
                             f"{score!r}; restore it from the run, or move its run folder out of the group")
    return FINISHED, float(score)


def run_env(run: Path) -> str:
    """The env id of the run folder ``run``, by its ``config.json``, read as its ``summary.json`` is: a finished run
    whose settings cannot be read is not filed under an env it does not name.

    Raises:
        RunRecordError: ``config.json`` is missing, empty (a start killed while it wrote it, before it was written
            whole), not a JSON object, or names no env.
    """
    path = run / CONFIG_NAME
    env = read_json_record(path).get("env")
    if not isinstance(env, str) or not env:
        raise RunRecordError(f"{path} must name the run's env in env, got {env!r}; restore it from the run, or move "
                             "its run folder out of the group")
    return env


def _number(value: str, path: Path, line: int, column: str) -> float:
    try:
        out = float(value)
    except ValueError:
        out = math.nan
    if not math.isfinite(out):
        raise RunRecordError(f"{path} must hold a finite number in column {column!r}, got {value!r} on line {line}; "
                             "restore it from the run, or move its run folder out of the group")
    return out


def read_evaluations(run: Path) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The periodic evaluations of the run folder ``run``, from its ``progress.csv``: ``(env_steps, returns)``,
    each evaluation at the env steps of the weights it evaluated (``eval/launch_env_steps``, else the row's
    ``env_steps``). The training rows between them and the confirmations of a target (``eval/confirmation``) are
    left out. A run without ``progress.csv`` has none.

    Raises:
        RunRecordError: the file cannot be read, or an evaluation's step or return is not a finite number.
    """
    path = run / CSV_NAME
    if not path.is_file():
        return (), ()
    steps: list[float] = []
    returns: list[float] = []
    try:
        with open(path, newline="") as f:
            for line, row in enumerate(csv.DictReader(f), start=2):
                value = row.get("eval/return") or ""
                if not value or (row.get("eval/confirmation") or "0") not in ("0", "0.0"):
                    continue
                column = "eval/launch_env_steps" if row.get("eval/launch_env_steps") else "env_steps"
                steps.append(_number(row.get(column) or "", path, line, column))
                returns.append(_number(value, path, line, "eval/return"))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise RunRecordError(f"{path} must be a run's progress.csv, got a file that cannot be read "
                             f"({str(e).splitlines()[0]}); restore it from the run, or move its run folder out of "
                             "the group") from None
    # A resumed run can log the evaluation of its resumed step twice; the curve keeps steps in the order run.
    order = sorted(range(len(steps)), key=lambda i: steps[i])
    return tuple(steps[i] for i in order), tuple(returns[i] for i in order)


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
    folders = run_folders(path)
    if not folders:
        raise ConfigError(f"GROUP {spec!r} must hold run folders (each a run's --logdir), got none; pass the folder "
                          "whose subfolders are the runs' --logdir")
    infos: list[RunInfo] = []
    left_out: list[tuple[str, str]] = []
    for run in folders:
        state, score = run_state(run)
        if score is None:
            left_out.append((str(run), state))
            continue
        env = run_env(run)
        config = read_json_record(run / CONFIG_NAME)
        seed = config.get("seed")
        infos.append(RunInfo(str(run), str(config.get("algo", "")), env,
                             seed if isinstance(seed, int) and not isinstance(seed, bool) else None, score,
                             *read_evaluations(run), config=config))
    return make_group(label, infos, left_out)


def make_group(label: str, infos: list[RunInfo], left_out: list[tuple[str, str]], *,
               reference: str | None = None) -> Group:
    """The :class:`Group` of finished runs ``infos`` and runs ``left_out``, its scores by env."""
    scores: dict[str, list[float]] = {}
    for info in infos:
        scores.setdefault(info.env, []).append(info.score)
    return Group(label, tuple(i.folder for i in infos), scores, tuple(left_out), tuple(infos), reference)


def check_complete(groups: list[Group], *, allow_missing: bool = False) -> None:
    """Refuses groups with runs that are not results (by default), or with no finished run at all.

    Raises:
        ConfigError: one line per such group, naming its runs and their states.
    """
    lines = []
    for g in groups:
        listed = ", ".join(f"{run} ({WHY_LEFT_OUT[state]})" for run, state in g.left_out)
        if not g.runs:
            lines.append(f"GROUP {g.label!r} must hold a finished run, got none: {listed}; finish or resume them")
        elif g.left_out and not allow_missing:
            lines.append(f"GROUP {g.label!r} must hold finished runs only, got {len(g.left_out)} that are not: "
                         f"{listed}; resume or remove them, or pass --allow-missing to compare the finished runs "
                         "(the count left out is reported)")
    if lines:
        raise ConfigError("\n".join(lines))


def check_uniform(groups: list[Group], *, allow_mixed: bool = False, normalized: bool = False) -> None:
    """Refuses groups that pool what a group over seeds must not (unless ``allow_mixed``): runs of several
    algorithms, runs of several envs (unless the scores are ``normalized``, which weighs each env alike), or two
    runs of one env with one seed (a copied folder counts one draw twice).

    Raises:
        ConfigError: one line per such group, naming its runs.
    """
    if allow_mixed:
        return
    lines = []
    for g in groups:
        faults = []
        for what, key in (("algorithms", lambda i: i.algo), ("envs", lambda i: i.env)):
            if what == "envs" and normalized:
                continue
            by: dict[str, list[str]] = {}
            for info in g.infos:
                by.setdefault(key(info), []).append(info.folder)
            if len(by) > 1:
                faults.append(f"{len(by)} {what}: " + "; ".join(f"{k or '?'} ({', '.join(v)})" for k, v in by.items()))
        seen: dict[tuple[str, int], list[str]] = {}
        for info in g.infos:
            if info.seed is not None:
                seen.setdefault((info.env, info.seed), []).append(info.folder)
        faults += [f"seed {seed} of {env} {len(v)} times ({', '.join(v)})" for (env, seed), v in seen.items()
                   if len(v) > 1]
        if faults:
            lines.append(f"GROUP {g.label!r} must hold runs of one algorithm and one env with distinct seeds, got "
                         f"{'; '.join(faults)}; split it into groups, or pass --allow-mixed to pool them"
                         f"{'' if normalized else ' (--normalize to weigh envs alike)'}")
    if lines:
        raise ConfigError("\n".join(lines))


def _group_curves(g: Group, table: dict[str, tuple[float, float]] | None,
                  options: dict[str, Any]) -> dict[str, Any] | str:
    """The curve of group ``g`` over seeds (each run's evaluations on one grid, their IQM at each step with its
    interval, normalised by ``table`` when given) and the IQM of its runs' areas under the curve; or why it has
    none (a run logged no evaluation, or the runs share no range of env steps)."""
    from rlstruct.algos.statistics import aggregate_scores, align_runs, area_under_curve, common_grid, curve_intervals

    bare = [i.folder for i in g.infos if not i.env_steps]
    if bare:
        return f"no evaluation rows in the progress.csv of {', '.join(bare)}"
    runs = [(i.env_steps, i.returns) for i in g.infos]
    try:
        grid, interpolated = common_grid(runs)
    except ValueError as e:  # runs of other budgets: the final scores still compare
        return str(e)
    by_env: dict[str, list[int]] = {}
    for k, info in enumerate(g.infos):
        by_env.setdefault(info.env, []).append(k)
    aligned = align_runs(runs, grid)
    if table is not None:
        for env, rows in by_env.items():
            low, high = table[env]
            aligned[rows] = (aligned[rows] - low) / (high - low)
    strata = {env: aligned[rows] for env, rows in by_env.items()}
    iqm = curve_intervals(strata, grid, **options)
    mean = curve_intervals(strata, grid, aggregate="mean", **options)
    areas = area_under_curve(grid, aligned)
    auc = aggregate_scores({env: areas[rows] for env, rows in by_env.items()}, names=("iqm",), **options)["iqm"]
    return {**iqm.to_dict("iqm"), "mean": mean.to_dict("mean")["mean"], "mean_low": mean.to_dict()["low"],
            "mean_high": mean.to_dict()["high"], "interpolated": interpolated, "n_runs": len(runs),
            "auc": auc.to_dict(), "auc_runs": [float(a) for a in areas]}


def compare_groups(groups: list[Group], *, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0,
                   allow_missing: bool = False, allow_mixed: bool = False,
                   table: dict[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """The statistics of ``groups`` as a JSON-able dict: per group its finished runs, the runs left out with their
    states (``"left_out"``, ``{folder: state}``, and their count, ``"n_left_out"``), IQM, mean and median with their
    intervals, and per env the same (``"envs"``) (``"groups"``); for every ordered pair of groups the probability of
    improvement (``"improvement"``, a list of ``{"x", "y", "value", "low", "high"}``); and per group whose runs all
    logged evaluations its curve over seeds (``"curves"``: ``{"env_steps", "iqm", "low", "high", "mean", ...,
    "auc"}``, the IQM of the runs' areas under the curve with its interval); for the others why not
    (``"no_curves"``).

    Args:
        groups: the groups (:func:`load_group`).
        confidence: the intervals' confidence level.
        n_resamples: the bootstrap's resamples.
        seed: the bootstrap's seed.
        allow_missing: compute over each group's finished runs when some of its runs are not results (else
            refuse: a statistic over the runs that survived is biased).
        allow_mixed: pool algorithms, envs or repeated seeds in a group (:func:`check_uniform`).
        table: env -> ``(random, reference)``: the aggregates, the curves and the probability of improvement are
            then of normalised scores (:func:`~rlstruct.algos.statistics.normalize_scores`), each env weighing
            alike, and the optimality gap is added; ``"normalized"`` says so.

    Raises:
        ConfigError: labels repeat, a group holds a run that is not a result (:func:`check_complete`) or pools runs
            it must not (:func:`check_uniform`), or an env has no row in ``table`` (naming the env).
    """
    from rlstruct.algos.statistics import RAW_AGGREGATES, aggregate_scores, normalize_scores, probability_of_improvement

    labels = [g.label for g in groups]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"GROUP labels must differ, got {labels}; name them, e.g. ppo=runs/a/ppo a2c=runs/b/a2c")
    check_complete(groups, allow_missing=allow_missing)
    check_uniform(groups, allow_mixed=allow_mixed, normalized=table is not None)
    scored: dict[str, dict[str, Any]] = {g.label: g.scores for g in groups}
    if table is not None:
        try:
            scored = {g.label: {env: v.tolist() for env, v in normalize_scores(g.scores, table).items()}
                      for g in groups}
        except ValueError as e:
            raise ConfigError(str(e)) from None
    names = (*RAW_AGGREGATES, "optimality_gap") if table is not None else RAW_AGGREGATES
    options = {"confidence": confidence, "n_resamples": n_resamples, "seed": seed}
    out: dict[str, Any] = {"confidence": confidence, "n_resamples": n_resamples, "seed": seed,
                           "normalized": table is not None, "groups": {}, "improvement": [], "curves": {}}
    for g in groups:
        estimates = aggregate_scores(scored[g.label], names=names, **options)
        envs = {env: {k: v.to_dict() for k, v in aggregate_scores(values, **options).items()} | {"runs": len(values)}
                for env, values in g.scores.items()}
        out["groups"][g.label] = {"runs": list(g.runs), "scores": g.scores, "n_left_out": len(g.left_out),
                                  "left_out": dict(g.left_out), "reference": g.reference, "envs": envs,
                                  **({"normalized_scores": scored[g.label]} if table is not None else {}),
                                  **{k: v.to_dict() for k, v in estimates.items()}}
        curve = _group_curves(g, table, options)
        if isinstance(curve, str):
            out.setdefault("no_curves", {})[g.label] = curve
        else:
            out["curves"][g.label] = curve
    for a, b in itertools.permutations(groups, 2):
        if set(a.scores) & set(b.scores):
            p = probability_of_improvement(scored[a.label], scored[b.label], **options)
            out["improvement"].append({"x": a.label, "y": b.label, **p.to_dict()})
    return out
