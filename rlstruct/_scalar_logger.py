"""A training loop's scalars by name and iteration: kept in memory (:class:`Logger`), and also written to a CSV file
and TensorBoard (:class:`TFLogger`), as the loggers of rlstructures' example programs were."""

from __future__ import annotations

import csv
import json
import logging
import os
import pickle
import time
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["Logger", "TFLogger"]

log = logging.getLogger(__name__)


class Logger:
    """Scalars by name and iteration, in memory.

    Args:
        **hps: the run's hyper-parameters (what :class:`TFLogger` adds to every CSV row as ``_hp_<name>``).

    Attributes:
        config: ``hps``.
        all_values: one dict per iteration, the list's index: ``{name: value, "_clock": seconds since the logger was
            built}`` (an iteration that logged nothing is ``{}``).

    >>> logger = Logger(lr=0.01)
    >>> logger.add_scalar("loss", torch.tensor(0.5), 0)
    >>> logger.add_dict({"eval": {"return": 10.0}}, 2)
    >>> logger.get_scalars("loss"), logger.get_scalar("eval/return"), logger.get_last()["eval"]
    ([0.5], 10.0, {'return': 10.0})
    """

    def __init__(self, **hps: Any):
        self.config = hps
        self.all_values: list[dict[str, Any]] = []
        self._start = time.time()
        #: every column name seen, in order (a dict: an ordered set)
        self.keys = dict.fromkeys(["training_iteration", "_clock", *(f"_hp_{k}" for k in hps)])

    def add_scalar(self, name: str, value: float | torch.Tensor, iteration: int) -> None:
        """Records ``value`` (a number, or a one-element tensor) under ``name`` at ``iteration``."""
        if isinstance(value, torch.Tensor):
            value = value.item()
        while len(self.all_values) <= iteration:
            self.all_values.append({})
        self.all_values[iteration][name] = value
        self.all_values[iteration]["_clock"] = time.time() - self._start
        self.keys.setdefault(name)

    def add_dict(self, values: Mapping[str, Any], iteration: int) -> None:
        """Records every number of a nested dict at ``iteration``, named by its keys joined with ``/``."""
        for name, value in _flatten(values).items():
            self.add_scalar(name, value, iteration)

    def add_images(self, name: str, value: Any, iteration: int) -> None:
        """Images are not kept in memory (:class:`TFLogger` writes them to TensorBoard)."""

    def get_scalars(self, name: str | list[str]) -> list[Any]:
        """The values recorded under ``name`` (a list of keys: joined with ``/``), in iteration order."""
        name = "/".join(name) if isinstance(name, list) else name
        return [row[name] for row in self.all_values if name in row]

    def get_scalar(self, name: str, iteration: int | None = None) -> Any:
        """The value of ``name`` at ``iteration`` (None: the last iteration)."""
        return self.all_values[-1 if iteration is None else iteration][name]

    def get_last(self) -> dict[str, Any]:
        """The last iteration's values as a nested dict (names split at ``/``)."""
        out: dict[str, Any] = {}
        for name, value in (self.all_values[-1] if self.all_values else {}).items():
            *parents, leaf = name.split("/")
            node = out
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = value
        return out

    def close(self) -> None:
        """Nothing to release in memory."""


class TFLogger(Logger):
    """A :class:`Logger` that also writes ``log_dir``: TensorBoard scalars and images (with the ``tensorboard``
    extra; without it, a warning and the CSV alone), ``params.json`` and ``params.pickle`` (the hyper-parameters),
    ``db.csv`` (one row per iteration, by :meth:`update_csv` and at :meth:`close`) and ``done`` once closed.

    Args:
        log_dir: the folder to write (created if missing).
        hps: the run's hyper-parameters.
        save_every: a name is recorded again only more than this many iterations after it last was (1: every time).
    """

    def __init__(self, log_dir: str | os.PathLike, hps: Mapping[str, Any] | None = None, save_every: int = 1):
        hps = dict(hps or {})
        super().__init__(**hps)
        self.log_dir = os.fspath(log_dir)
        self.save_every = save_every
        self._last: dict[str, int] = {}
        os.makedirs(self.log_dir, exist_ok=True)
        with open(os.path.join(self.log_dir, "params.json"), "w") as f:
            json.dump(hps, f, indent=2, default=str)
        with open(os.path.join(self.log_dir, "params.pickle"), "wb") as f:
            pickle.dump(hps, f)
        self.csvname = os.path.join(self.log_dir, "db.csv")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.warning("tensorboard is not installed (pip install 'rlstruct[tensorboard]'); TFLogger writes %s only",
                        self.csvname)
            self.writer = None
        else:
            self.writer = SummaryWriter(log_dir=self.log_dir)
            self.writer.add_text("Hyperparameters", str(hps))

    def add_scalar(self, name: str, value: float | torch.Tensor, iteration: int) -> None:
        """Records ``value`` (see :class:`Logger`), at most once per ``save_every`` iterations a name; TensorBoard
        gets the Python numbers."""
        if name in self._last and iteration - self._last[name] <= self.save_every and self.save_every > 1:
            return
        self._last[name] = iteration
        super().add_scalar(name, value, iteration)
        if self.writer is not None and isinstance(value, (int, float)):
            self.writer.add_scalar(name, value, iteration)

    def add_images(self, name: str, value: Any, iteration: int) -> None:
        """Writes a batch of images ``[N, C, H, W]`` to TensorBoard."""
        if self.writer is not None:
            self.writer.add_images(name, value, iteration)

    def update_csv(self) -> None:
        """Writes ``db.csv``: a row per iteration that logged something, with its ``training_iteration`` and the
        hyper-parameters as ``_hp_<name>`` columns."""
        hps = {f"_hp_{k}": v for k, v in self.config.items()}
        with open(self.csvname, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(self.keys), restval="")
            writer.writeheader()
            writer.writerows({**hps, **row, "training_iteration": i} for i, row in enumerate(self.all_values) if row)

    def close(self) -> None:
        """Writes ``db.csv``, closes TensorBoard's writer and marks the folder ``done``."""
        if self.writer is not None:
            self.writer.close()
        self.update_csv()
        with open(os.path.join(self.log_dir, "done"), "w") as f:
            f.write("Done\n")


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out
