"""The search spaces of ``rlstruct sweep``: their check (:func:`check_space`; each algorithm module's
``SEARCH_SPACE`` is its default), a space read from a JSON or YAML file (:func:`load_space`), and a trial's draw from
one (:func:`suggest`).

A space maps a config field to its range: ``{"low": 1e-4, "high": 1e-2, "log": true}`` (floats, or ints when both
bounds are ints; an optional ``step``), or ``{"choices": [8, 16, 32]}`` (a choice may be a list, for a tuple field
such as ``hidden_sizes``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["check_space", "covering", "load_space", "suggest", "trial_params"]

def check_space(space: Any, config_cls: type, *, source: str = "the search space") -> dict[str, dict[str, Any]]:
    """Returns ``space`` if every entry names a field of ``config_cls`` and holds a range or choices.

    Raises:
        ValueError: an unknown field, or an entry that is neither ``{"low", "high"[, "log", "step"]}`` nor
            ``{"choices": [...]}``; the message names ``source``.

    >>> from rlstruct.algos._train.config import RunConfig
    >>> check_space({"lr": {"choices": []}}, RunConfig)
    Traceback (most recent call last):
    ...
    ValueError: the search space's entry 'lr' must be {"low": L, "high": H} (optionally "log": true, "step": S) or \
{"choices": [...]} with at least one choice, got {'choices': []}
    """
    if not isinstance(space, Mapping) or not space:
        raise ValueError(f"{source} must map config fields to ranges, got {space!r}")
    fields = {f.name for f in dataclasses.fields(config_cls)}
    for name, entry in space.items():
        if name not in fields:
            raise ValueError(f"{source} names {name!r}, which {config_cls.__name__} does not have; use its fields "
                             "(rlstruct train ALGO --help lists them as flags)")
        ranged = isinstance(entry, Mapping) and {"low", "high"} <= set(entry) <= {"low", "high", "log", "step"}
        chosen = isinstance(entry, Mapping) and set(entry) == {"choices"} and isinstance(entry["choices"], list) \
            and len(entry["choices"]) > 0
        if ranged and not entry["low"] <= entry["high"]:
            ranged = False
        if not (ranged or chosen):
            raise ValueError(f"{source}'s entry {name!r} must be {{\"low\": L, \"high\": H}} (optionally "
                             f"\"log\": true, \"step\": S) or {{\"choices\": [...]}} with at least one choice, "
                             f"got {entry!r}")
    return {name: dict(entry) for name, entry in space.items()}


def load_space(path: str | Path, config_cls: type) -> dict[str, dict[str, Any]]:
    """The search space in a JSON or YAML file (``.yaml``/``.yml``; YAML comes with Optuna), checked.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file does not parse, or :func:`check_space` refuses it.
    """
    text = Path(path).read_text()
    try:
        if str(path).endswith((".yaml", ".yml")):
            import yaml

            space = yaml.safe_load(text)
        else:
            space = json.loads(text)
    except ValueError as e:  # json's and yaml's errors both derive from it
        raise ValueError(f"--space {str(path)!r} must be a JSON or YAML mapping, got a parse error: {e}") from None
    return check_space(space, config_cls, source=f"--space {str(path)!r}")


def _choice_key(value: Any) -> Any:
    """A choice as Optuna stores it: lists (a tuple field's values) as their JSON text."""
    return json.dumps(list(value)) if isinstance(value, (list, tuple)) else value


def covering(space: Mapping[str, Mapping[str, Any]], values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``space`` widened to hold ``values`` (a config's settings, e.g. its preset's): a value off a range moves the
    bound, one not among the choices joins them; so that the preset can be a trial of the search.

    >>> covering({"lr": {"low": 1e-4, "high": 1e-2}, "n": {"choices": [8, 16]}}, {"lr": 0.02, "n": 32})
    {'lr': {'low': 0.0001, 'high': 0.02}, 'n': {'choices': [8, 16, 32]}}
    """
    out = {}
    for name, entry in space.items():
        entry, value = dict(entry), values[name]
        if "choices" in entry:
            keys = [_choice_key(c) for c in entry["choices"]]
            if _choice_key(value) not in keys:
                entry["choices"] = [*entry["choices"], list(value) if isinstance(value, tuple) else value]
        elif value is not None and "step" not in entry:
            entry["low"], entry["high"] = min(entry["low"], value), max(entry["high"], value)
        out[name] = entry
    return out


def suggest(trial: Any, space: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A trial's settings: ``{field: value}``, each drawn by the Optuna ``trial`` from its entry of ``space``
    (a list choice comes back as a tuple, the config's type)."""
    out: dict[str, Any] = {}
    for name, entry in space.items():
        if "choices" in entry:
            keys = [_choice_key(c) for c in entry["choices"]]
            key = trial.suggest_categorical(name, keys)
            out[name] = tuple(json.loads(key)) if isinstance(key, str) and key.startswith("[") else key
        elif isinstance(entry["low"], int) and isinstance(entry["high"], int) and not isinstance(entry["low"], bool):
            out[name] = trial.suggest_int(name, entry["low"], entry["high"], step=entry.get("step", 1),
                                          log=entry.get("log", False))
        else:
            out[name] = trial.suggest_float(name, float(entry["low"]), float(entry["high"]), step=entry.get("step"),
                                            log=entry.get("log", False))
    return out


def trial_params(values: Mapping[str, Any], space: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``values`` (a config's settings) as the parameters of an Optuna trial of ``space`` (what
    ``study.enqueue_trial`` takes): the space's fields only, list choices as their JSON text."""
    return {name: _choice_key(values[name]) if "choices" in space[name] else values[name] for name in space}
