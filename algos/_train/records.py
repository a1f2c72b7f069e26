"""Recorded runs: a group of run folders packed into one small JSON file (:func:`pack_runs`): each run's state,
``config.json``, ``summary.json`` and evaluations from ``progress.csv``, no weights, no machine paths; and such a
file read back as a group (:func:`load_reference`) that ``rlstruct compare --reference`` holds beside the user's.

The package ships the records of its own reference runs under ``rlstruct/algos/data/references/NAME.json``
(:func:`shipped_references`); ``benchmarks/published.py --pack`` writes them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlstruct.algos._train.compare import (
    FINISHED,
    INTERRUPTED,
    PARTIAL,
    Group,
    RunInfo,
    counts,
    make_group,
    read_evaluations,
    read_json_record,
    record_state,
    run_folders,
    run_state,
)
from rlstruct.algos._train.run_folder import CONFIG_NAME, SUMMARY_NAME
from rlstruct.errors import ConfigError, RunRecordError

__all__ = ["FORMAT", "REFERENCES", "load_reference", "merge_records", "pack_runs", "shipped_references",
           "write_records"]

#: the ``format`` a records file declares
FORMAT = "rlstruct.records/1"
#: the folder of the records the package ships
REFERENCES = Path(__file__).resolve().parent.parent / "data" / "references"
#: the keys of a config or summary that hold a path on the machine that ran it, dropped from the records
_PATH_KEYS = ("logdir", "checkpoint", "plot", "resume", "track")


def shipped_references() -> list[str]:
    """The names of the records the package ships, sorted."""
    return sorted(p.stem for p in REFERENCES.glob("*.json"))


def pack_runs(folder: str | Path, *, name: str, about: str = "", command: str = "",
              extra: Callable[[Path], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The records of the runs in ``folder`` (a group, as ``rlstruct compare`` reads it), every run accounted for:
    ``{"format", "name", "about", "command", "runs": [{"name", "state", "config", "summary", "env_steps",
    "returns"}]}``, a run's name being its folder's name, the configs and summaries without their machine paths;
    with ``extra``, each run also holds ``extra(run_folder)`` (JSON-able) under ``"extra"``.

    Raises:
        ConfigError: ``folder`` holds no run folder.
        RunRecordError: a run's record cannot be read.
    """
    folders = run_folders(str(folder))
    if not folders:
        raise ConfigError(f"--pack must name a folder of run folders, got {str(folder)!r}, which holds none; pass "
                          "the folder whose subfolders are the runs' --logdir")
    runs = []
    for run in folders:
        state, _ = run_state(run)
        config_path, summary_path = run / CONFIG_NAME, run / SUMMARY_NAME
        config = read_json_record(config_path) if config_path.is_file() and config_path.stat().st_size else {}
        summary = read_json_record(summary_path) if summary_path.is_file() else {}
        steps, returns = read_evaluations(run)
        runs.append({"name": run.name, "state": state,
                     "config": {k: v for k, v in config.items() if k not in _PATH_KEYS},
                     "summary": {k: v for k, v in summary.items() if k not in _PATH_KEYS},
                     "env_steps": list(steps), "returns": list(returns),
                     **({"extra": extra(run)} if extra is not None else {})})
    return {"format": FORMAT, "name": name, "about": about, "command": command, "runs": runs}


def _refuse(path: Path, what: str) -> RunRecordError:
    return RunRecordError(f"{path} must be a records file ({FORMAT}, benchmarks/published.py --pack), got {what}; "
                          "pack the runs again")


def _read_records(path: Path) -> dict[str, Any]:
    records = read_json_record(path)
    if records.get("format") != FORMAT:
        raise _refuse(path, f"format {records.get('format')!r}")
    if not isinstance(records.get("runs"), list) or not records["runs"]:
        raise _refuse(path, "no runs")
    return records


def _records_path(target: str) -> Path:
    """The records file that ``target`` names: a file the user names, else a shipped name, looked up among the
    shipped names only, so that a name cannot reach a file outside them (``../x``)."""
    path = Path(target)
    if path.is_file():
        return path
    if target in shipped_references():
        return REFERENCES / f"{target}.json"
    raise ConfigError(f"--reference must be a records file or a shipped name ({', '.join(shipped_references())}), "
                      f"got {target!r}; pass one of them or a file benchmarks/published.py --pack wrote")


def _runs_of(path: Path, *, allow_partial: bool = False) -> tuple[str, list[RunInfo], list[tuple[str, str]],
                                                                  dict[str, str]]:
    """The name of the records at ``path``, their counted runs, the runs left out with their states, and where and
    why each run that stopped before its budget stopped. A run packed as finished, partial or interrupted is judged
    again by its summary and config (:func:`~.compare.record_state`): records packed before a time limit counted
    against a run say ``"finished"`` of it."""
    records = _read_records(path)
    name = str(records.get("name") or path.stem)
    infos: list[RunInfo] = []
    left_out: list[tuple[str, str]] = []
    stopped_at: dict[str, str] = {}
    for run in records["runs"]:
        if not isinstance(run, dict):
            raise _refuse(path, f"a run that is a {type(run).__name__}")
        folder = f"{name}/{run.get('name', '?')}"
        if run.get("state") not in (FINISHED, PARTIAL, INTERRUPTED):
            left_out.append((folder, str(run.get("state"))))
            continue
        config, summary = run.get("config") or {}, run.get("summary") or {}
        if not isinstance(config, dict) or not isinstance(summary, dict):
            raise _refuse(path, f"run {folder} whose config or summary is not a JSON object")
        state, _, stopped = record_state(summary, config)
        state = INTERRUPTED if run.get("state") == INTERRUPTED else state
        score, seed = summary.get("eval_return"), config.get("seed")
        finite = not isinstance(score, bool) and isinstance(score, (int, float)) and math.isfinite(score)
        if state in (FINISHED, PARTIAL) and not finite:
            raise _refuse(path, f"run {folder} finished without a finite eval_return ({score!r})")
        counted = counts(state, score if finite else None, allow_partial=allow_partial)
        if stopped is not None and (state == PARTIAL or counted):
            stopped_at[folder] = stopped
        if not counted:
            left_out.append((folder, state))
            continue
        steps, returns = run.get("env_steps") or [], run.get("returns") or []
        if len(steps) != len(returns):
            raise _refuse(path, f"run {folder} with {len(steps)} env steps for {len(returns)} returns")
        infos.append(RunInfo(folder, str(config.get("algo", "")), str(config.get("env", "")),
                             seed if isinstance(seed, int) and not isinstance(seed, bool) else None, float(score),
                             tuple(map(float, steps)), tuple(map(float, returns)), config=config,
                             stopped_early=None if state == FINISHED else stopped or state))
    return name, infos, left_out, stopped_at


def load_reference(spec: str, *, allow_partial: bool = False) -> Group:
    """The group recorded in ``spec``: ``[LABEL=]RECORDS[,RECORDS...]``, each RECORDS a shipped name
    (:func:`shipped_references`) or a records file, several making one group (one method over several envs);
    LABEL defaults to ``ref:`` and the names. Its runs are named ``NAME/RUN``; its finished runs carry their configs,
    scores and evaluations, the others are left out with their states (``allow_partial``: a run that stopped before
    its budget with a score counts, as :func:`~.compare.load_group` counts it).

    Raises:
        ConfigError: a RECORDS is neither a file nor a shipped name (a name with a path separator or ``..`` is none:
            the message lists the shipped names).
        RunRecordError: a file is not a records file, or a finished run has no finite score.
    """
    label, sep, targets = spec.partition("=")
    if not sep:
        label, targets = "", spec
    names: list[str] = []
    infos: list[RunInfo] = []
    left_out: list[tuple[str, str]] = []
    stopped_at: dict[str, str] = {}
    for target in targets.split(","):
        name, counted, others, stopped = _runs_of(_records_path(target), allow_partial=allow_partial)
        names.append(name)
        infos += counted
        left_out += others
        stopped_at.update(stopped)
    return make_group(label or f"ref:{'+'.join(names)}", infos, left_out, reference="+".join(names),
                      stopped_early=stopped_at)


def merge_records(path: str | Path, packed: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The records of one row whose seeds ran on several machines: the records file at ``path`` with the runs of
    ``packed`` (:func:`pack_runs` of the run folders at hand) in it. A packed run replaces the recorded run of its
    name, except that a finished run is never replaced by one that has not finished (a seed run again, still
    running); a recorded run with no folder at hand is kept. Returns the merged records (``packed``'s head, the
    recorded runs in their order, then the new ones) and the names of the recorded runs kept over a packed one.

    Raises:
        RunRecordError: ``path`` is not a records file, or records another row (its ``name`` or ``about``, the
            preset and env, differs from ``packed``'s): merging would mix two methods' seeds.
    """
    path = Path(path)
    recorded = _read_records(path)
    for key in ("name", "about"):
        if recorded.get(key) != packed.get(key):
            raise RunRecordError(f"{path} records {key} {recorded.get(key)!r}, and the runs packed into it "
                                 f"{packed.get(key)!r}; seeds of two rows cannot be merged: pack into another file, "
                                 "or replace the records (published.py --replace)")
    fresh = {run["name"]: run for run in packed["runs"]}
    runs, kept = [], []
    for run in recorded["runs"]:
        new = fresh.pop(run.get("name"), None)
        if new is not None and run.get("state") == FINISHED and new.get("state") != FINISHED:
            kept.append(str(run.get("name")))
            new = None
        runs.append(run if new is None else new)
    return {**packed, "runs": runs + list(fresh.values())}, kept


def write_records(records: dict[str, Any], path: str | Path) -> Path:
    """Writes ``records`` to ``path`` as compact JSON (one run a line), whole (a temporary file renamed)."""
    from rlstruct.algos._train.durable import write_whole

    head = {k: v for k, v in records.items() if k != "runs"}
    runs = ",\n".join(json.dumps(r, separators=(",", ":")) for r in records["runs"])
    text = json.dumps(head)[:-1] + ', "runs": [\n' + runs + "\n]}\n"
    path = Path(path)
    write_whole(path, text)
    return path
