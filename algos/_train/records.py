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
    Group,
    RunInfo,
    make_group,
    read_evaluations,
    read_json_record,
    run_folders,
    run_state,
)
from rlstruct.algos._train.run_folder import CONFIG_NAME, SUMMARY_NAME
from rlstruct.errors import ConfigError, RunRecordError

__all__ = ["FORMAT", "REFERENCES", "load_reference", "pack_runs", "shipped_references", "write_records"]

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
    path = Path(target)
    if path.is_file():
        return path
    if (REFERENCES / f"{target}.json").is_file():
        return REFERENCES / f"{target}.json"
    raise ConfigError(f"--reference must be a records file or a shipped name ({', '.join(shipped_references())}), "
                      f"got {target!r}; pass one of them or a file benchmarks/published.py --pack wrote")


def _runs_of(path: Path) -> tuple[str, list[RunInfo], list[tuple[str, str]]]:
    """The name of the records at ``path``, their finished runs and the runs left out with their states."""
    records = _read_records(path)
    name = str(records.get("name") or path.stem)
    infos: list[RunInfo] = []
    left_out: list[tuple[str, str]] = []
    for run in records["runs"]:
        if not isinstance(run, dict):
            raise _refuse(path, f"a run that is a {type(run).__name__}")
        folder = f"{name}/{run.get('name', '?')}"
        if run.get("state") != FINISHED:
            left_out.append((folder, str(run.get("state"))))
            continue
        config, summary = run.get("config") or {}, run.get("summary") or {}
        score, seed = summary.get("eval_return"), config.get("seed")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise _refuse(path, f"run {folder} finished without a finite eval_return ({score!r})")
        steps, returns = run.get("env_steps") or [], run.get("returns") or []
        if len(steps) != len(returns):
            raise _refuse(path, f"run {folder} with {len(steps)} env steps for {len(returns)} returns")
        infos.append(RunInfo(folder, str(config.get("algo", "")), str(config.get("env", "")),
                             seed if isinstance(seed, int) and not isinstance(seed, bool) else None, float(score),
                             tuple(map(float, steps)), tuple(map(float, returns)), config=config))
    return name, infos, left_out


def load_reference(spec: str) -> Group:
    """The group recorded in ``spec``: ``[LABEL=]RECORDS[,RECORDS...]``, each RECORDS a shipped name
    (:func:`shipped_references`) or a records file, several making one group (one method over several envs);
    LABEL defaults to ``ref:`` and the names. Its runs are named ``NAME/RUN``; its finished runs carry their configs,
    scores and evaluations, the others are left out with their states.

    Raises:
        ConfigError: a RECORDS is neither a file nor a shipped name (the message lists the shipped names).
        RunRecordError: a file is not a records file, or a finished run has no finite score.
    """
    label, sep, targets = spec.partition("=")
    if not sep:
        label, targets = "", spec
    names: list[str] = []
    infos: list[RunInfo] = []
    left_out: list[tuple[str, str]] = []
    for target in targets.split(","):
        name, finished, others = _runs_of(_records_path(target))
        names.append(name)
        infos += finished
        left_out += others
    return make_group(label or f"ref:{'+'.join(names)}", infos, left_out, reference="+".join(names))


def write_records(records: dict[str, Any], path: str | Path) -> Path:
    """Writes ``records`` to ``path`` as compact JSON (one run a line), whole (a temporary file renamed)."""
    from rlstruct.algos._train.durable import write_whole

    head = {k: v for k, v in records.items() if k != "runs"}
    runs = ",\n".join(json.dumps(r, separators=(",", ":")) for r in records["runs"])
    text = json.dumps(head)[:-1] + ', "runs": [\n' + runs + "\n]}\n"
    path = Path(path)
    write_whole(path, text)
    return path
