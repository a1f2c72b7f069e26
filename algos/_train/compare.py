"""What ``rlstruct compare`` computes: groups of run folders read back (:func:`load_group`), checked (finished runs,
one algorithm, one env, distinct seeds) and their statistics (:func:`compare_groups`, from
:mod:`rlstruct.algos.statistics`). The command and its table are
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

from rlstruct.algos._train.result import stopped_early
from rlstruct.algos._train.run_folder import CONFIG_NAME, CSV_NAME, SUMMARY_NAME, earlier_run_files
from rlstruct.errors import ConfigError, RunRecordError

__all__ = ["Group", "RunInfo", "check_complete", "check_uniform", "compare_groups", "counts", "left_out_reason",
           "load_group", "make_group", "read_evaluations", "read_json_record", "record_state", "run_env",
           "run_folders", "run_state"]


#: what a run folder holds, as ``compare`` lists it: only a finished run (its budget spent or its target reached) is
#: a result; a partial one stopped before its budget (its time limit, another rank), an interrupted one by a signal
#: or a worker's failure
FINISHED, PARTIAL, INTERRUPTED, DIVERGED, NO_SUMMARY = "finished", "partial", "interrupted", "diverged", "no summary"
#: why each state that is not a result is not one, as the listing says it
WHY_LEFT_OUT = {PARTIAL: "stopped before its step budget", INTERRUPTED: "interrupted", DIVERGED: "diverged",
                NO_SUMMARY: "no summary: crashed, killed or still running"}
#: the states of runs that stopped early with a score, which ``allow_partial`` counts
_CUT = (PARTIAL, INTERRUPTED)


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a finished run of a group is: its folder, what its ``config.json`` says it ran, its score and its
    evaluations (``env_steps``, ``returns``: the periodic evaluations of ``progress.csv``, in order; empty when it
    logged none); ``stopped_early`` says where a run counted though it stopped before its budget
    (``allow_partial``) stopped (:func:`~rlstruct.algos._train.result.stopped_early`)."""

    folder: str
    algo: str
    env: str
    seed: int | None
    score: float
    env_steps: tuple[float, ...] = ()
    returns: tuple[float, ...] = ()
    config: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    stopped_early: str | None = None


@dataclasses.dataclass(frozen=True)
class Group:
    """The runs of one group: its label, each finished run's folder and its score (the ``eval_return`` of its
    ``summary.json``: the final evaluation, or that of the weights kept when an evaluation reached the target),
    by env, and the run folders that hold no result.

    Attributes:
        label: the name the table and the plot give it.
        runs: the finished runs' folders, in order.
        scores: env id -> the scores of its finished runs.
        left_out: ``(folder, state)`` of each run that is not a result: ``"partial"`` (it stopped before its step
            budget: its time limit, another rank), ``"interrupted"`` (its summary says so, or that a worker failed:
            ``stop_reason`` ``"worker_failed"``), ``"diverged"`` (``stop_reason``), ``"no summary"`` (it crashed,
            was killed, or still runs).
        infos: each finished run's :class:`RunInfo`, in the order of ``runs``.
        reference: the name of the records it was read from (``--reference``), None for run folders.
        stopped_early: folder -> where and why it stopped, for each run that stopped before its budget, left out
            (``"partial"``) or counted (``allow_partial``).
    """

    label: str
    runs: tuple[str, ...]
    scores: dict[str, list[float]]
    left_out: tuple[tuple[str, str], ...] = ()
    infos: tuple[RunInfo, ...] = ()
    reference: str | None = None
    stopped_early: dict[str, str] = dataclasses.field(default_factory=dict)


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


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def record_state(summary: dict[str, Any], config: dict[str, Any]) -> tuple[str, float | None, str | None]:
    """What a run is by its ``summary.json`` and ``config.json`` (their contents): ``(state, score, stopped)``.

    The state is ``"diverged"``, ``"interrupted"`` (a signal, a worker's failure), ``"partial"`` (it stopped before
    its step budget for another reason but its target: its time limit, another rank) or ``"finished"`` (its budget
    spent, its target reached, or no reason recorded). ``score`` is its finite ``eval_return``, else None; ``stopped``
    says where and why a run that is not finished stopped
    (:func:`~rlstruct.algos._train.result.stopped_early`; its step budget is the summary's ``max_env_steps``, else
    the config's).

    >>> record_state({"eval_return": 9.4, "env_steps": 0, "stop_reason": "time_limit"}, {"max_env_steps": 100_000})
    ('partial', 9.4, 'stopped at 0 of 100,000 env steps (its time limit)')
    """
    reason = summary.get("stop_reason")
    if reason == "diverged":
        return DIVERGED, None, None
    score = summary.get("eval_return")
    finite = not isinstance(score, bool) and isinstance(score, (int, float)) and math.isfinite(score)
    steps = summary.get("env_steps")
    steps = None if isinstance(steps, bool) or not isinstance(steps, (int, float)) else steps
    budget = _count(summary.get("max_env_steps")) or _count(config.get("max_env_steps"))
    interrupted = bool(summary.get("interrupted")) or reason in ("signal", "worker_failed")
    if interrupted and reason not in ("signal", "worker_failed"):
        reason = "signal"
    stopped = stopped_early(reason, steps, budget)
    state = INTERRUPTED if interrupted else PARTIAL if stopped is not None else FINISHED
    return state, float(score) if finite else None, stopped


def _config_or_empty(run: Path) -> dict[str, Any]:
    """The run's ``config.json`` where it reads as a JSON object, else ``{}``: only its budget is read from it
    here, and a run that is no result is listed whatever its config holds."""
    try:
        config = json.loads((run / CONFIG_NAME).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return config if isinstance(config, dict) else {}


def _read_state(run: Path) -> tuple[str, float | None, str | None]:
    path = run / SUMMARY_NAME
    if not path.is_file():
        return NO_SUMMARY, None, None
    summary = read_json_record(path)
    state, score, stopped = record_state(summary, _config_or_empty(run))
    if state in (FINISHED, PARTIAL) and score is None:
        raise RunRecordError(f"{path} must hold the run's final evaluation as a finite number in eval_return, got "
                             f"{summary.get('eval_return')!r}; restore it from the run, or move its run folder out "
                             "of the group")
    return state, score, stopped


def run_state(run: Path) -> tuple[str, float | None]:
    """What the run folder ``run`` holds, by its ``summary.json`` (and its ``config.json``'s step budget):
    ``(state, score)`` (:func:`record_state`), the score (``eval_return``) of a finished or partial run, and of an
    interrupted one whose last evaluation finished.

    Raises:
        RunRecordError: its summary cannot be read, or a finished or partial run's ``eval_return`` is missing, not a
            number or not finite.
    """
    state, score, _ = _read_state(run)
    return state, score


def left_out_reason(state: str, stopped: str | None = None) -> str:
    """Why a run in ``state`` is left out, as the listings say it: where and why a partial run stopped
    (``stopped``), else its state's words (:data:`WHY_LEFT_OUT`; another state, from records, as it is)."""
    return stopped if stopped and state == PARTIAL else WHY_LEFT_OUT.get(state, state)


def counts(state: str, score: float | None, *, allow_partial: bool) -> bool:
    """Whether a run in ``state`` with ``score`` is a result: a finished one, or, ``allow_partial``, one that stopped
    early (partial or interrupted) with a score."""
    return state == FINISHED or (allow_partial and state in _CUT and score is not None)


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


def load_group(spec: str, *, allow_partial: bool = False) -> Group:
    """Reads the runs of ``spec``: ``[LABEL=]PATH``, PATH a folder holding one run folder per seed (``--logdir
    DIR/seed-0``, ...) or a quoted glob pattern matching run folders; LABEL defaults to PATH's last part. Every run
    folder is accounted for: a finished run's score is read, the others are listed in :attr:`Group.left_out`;
    ``allow_partial`` counts the runs that stopped before their budget with a score too
    (:attr:`RunInfo.stopped_early` says where).

    Raises:
        FileNotFoundError: PATH does not exist.
        ConfigError: it holds no run folder.
        RunRecordError: a run's ``summary.json`` or ``config.json`` cannot be read, or a finished or partial run has
            no finite ``eval_return`` (the message names the file).
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
    stopped_at: dict[str, str] = {}
    for run in folders:
        state, score, stopped = _read_state(run)
        counted = counts(state, score, allow_partial=allow_partial)
        if stopped is not None and (state == PARTIAL or counted):
            stopped_at[str(run)] = stopped
        if not counted:
            left_out.append((str(run), state))
            continue
        env = run_env(run)
        config = read_json_record(run / CONFIG_NAME)
        seed = config.get("seed")
        infos.append(RunInfo(str(run), str(config.get("algo", "")), env,
                             seed if isinstance(seed, int) and not isinstance(seed, bool) else None, score,
                             *read_evaluations(run), config=config,
                             stopped_early=None if state == FINISHED else stopped or WHY_LEFT_OUT[state]))
    return make_group(label, infos, left_out, stopped_early=stopped_at)


def make_group(label: str, infos: list[RunInfo], left_out: list[tuple[str, str]], *,
               reference: str | None = None, stopped_early: dict[str, str] | None = None) -> Group:
    """The :class:`Group` of counted runs ``infos`` and runs ``left_out``, its scores by env; ``stopped_early``:
    folder -> where and why, of its runs that stopped before their budget."""
    scores: dict[str, list[float]] = {}
    for info in infos:
        scores.setdefault(info.env, []).append(info.score)
    return Group(label, tuple(i.folder for i in infos), scores, tuple(left_out), tuple(infos), reference,
                 dict(stopped_early or {}))


def check_complete(groups: list[Group], *, allow_missing: bool = False) -> None:
    """Refuses groups with runs that are not results (by default), or with no finished run at all.

    Raises:
        ConfigError: one line per such group, naming its runs and their states (where a run that stopped early
            stopped, and why).
    """
    lines = []
    for g in groups:
        listed = ", ".join(f"{run} ({left_out_reason(state, g.stopped_early.get(run))})" for run, state in g.left_out)
        partial = any(state == PARTIAL for _, state in g.left_out)
        count = "--allow-partial to count the runs stopped before their budget as they are"
        if not g.runs:
            lines.append(f"GROUP {g.label!r} must hold a finished run, got none: {listed}; finish or resume them"
                         f"{f', or pass {count}' if partial else ''}")
        elif g.left_out and not allow_missing:
            lines.append(f"GROUP {g.label!r} must hold finished runs only, got {len(g.left_out)} that are not: "
                         f"{listed}; resume or remove them, or pass --allow-missing to compare the finished runs "
                         f"(the count left out is reported){f', or {count}' if partial else ''}")
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


def _budgets(g: Group, by_env: dict[str, list[int]]) -> dict[str, float]:
    """Each env's step budget, by which its runs' env steps are divided on a pooled axis: the largest of its runs'
    ``max_env_steps`` and of their last evaluations' env steps (a run's last iteration can pass its budget)."""
    out = {}
    for env, rows in by_env.items():
        ends = [max(g.infos[k].env_steps[-1], _count(g.infos[k].config.get("max_env_steps")) or 0) for k in rows]
        out[env] = float(max(ends)) or 1.0
    return out


def _group_curves(g: Group, table: dict[str, tuple[float, float]] | None,
                  options: dict[str, Any]) -> dict[str, Any] | str:
    """The curve of group ``g`` over seeds (each run's evaluations on one grid, their IQM at each step with its
    interval, normalised by ``table`` when given) and the IQM of its runs' areas under the curve on that grid; or
    why it has none (a run logged no evaluation, or the runs share no range of env steps).

    The grid of a group over one env is of env steps (``"env_steps"``; ``"budget_fraction"`` gives the same points
    as fractions of its budget). A group over several envs, whose budgets differ (MinAtar's 5M beside CartPole's
    100k), is pooled over the fraction of each env's budget (``"budget_fraction"``, 0 to 1; ``"env_steps"`` None):
    each run's evaluations are read at the same fractions of its own env's budget, so that every env counts over its
    whole budget, in the curve and in its area alike."""
    from rlstruct.algos.statistics import aggregate_scores, align_runs, area_under_curve, common_grid, curve_intervals

    bare = [i.folder for i in g.infos if not i.env_steps]
    if bare:
        return f"no evaluation rows in the progress.csv of {', '.join(bare)}"
    by_env: dict[str, list[int]] = {}
    for k, info in enumerate(g.infos):
        by_env.setdefault(info.env, []).append(k)
    budgets = _budgets(g, by_env)
    pooled = len(by_env) > 1
    runs = [(tuple(s / budgets[i.env] for s in i.env_steps) if pooled else i.env_steps, i.returns) for i in g.infos]
    try:
        grid, interpolated = common_grid(runs)
    except ValueError as e:  # runs of other budgets: the final scores still compare
        return str(e)
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
    curve = iqm.to_dict("iqm")
    scale = 1.0 if pooled else next(iter(budgets.values()))
    fraction = [float(x) / scale for x in grid]
    return {**curve, "env_steps": None if pooled else curve["env_steps"], "budget_fraction": fraction,
            "budgets": budgets, "mean": mean.to_dict("mean")["mean"], "mean_low": mean.to_dict()["low"],
            "mean_high": mean.to_dict()["high"], "interpolated": interpolated, "n_runs": len(runs),
            "auc": auc.to_dict(), "auc_runs": [float(a) for a in areas]}


def compare_groups(groups: list[Group], *, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0,
                   allow_missing: bool = False, allow_mixed: bool = False,
                   table: dict[str, tuple[float, float]] | None = None) -> dict[str, Any]:
    """The statistics of ``groups`` as a JSON-able dict: per group its finished runs, the runs left out with their
    states (``"left_out"``, ``{folder: state}``, and their count, ``"n_left_out"``), IQM, mean and median with their
    intervals, and per env the same (``"envs"``) (``"groups"``); for every ordered pair of groups the probability of
    improvement (``"improvement"``, a list of ``{"x", "y", "value", "low", "high"}``); and per group whose runs all
    logged evaluations its curve over seeds (``"curves"``: ``{"env_steps", "budget_fraction", "iqm", "low", "high",
    "mean", ..., "auc"}``, the IQM of the runs' areas under the curve on the curve's grid with its interval; a group
    over several envs is pooled over the fraction of each env's budget, ``"env_steps"`` None); for the others why not
    (``"no_curves"``). Each group's ``"stopped_early"`` says, for each run that stopped before its budget (left out,
    or counted by ``allow_partial`` of :func:`load_group`), where and why.

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
                                  "left_out": dict(g.left_out), "stopped_early": dict(g.stopped_early),
                                  "reference": g.reference, "envs": envs,
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
