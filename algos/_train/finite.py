"""The non-finite guard: a run's settings must be finite numbers (:func:`check_finite_settings`), a run whose losses,
gradient norms or weights turn NaN or infinite stops as diverged (:class:`DivergenceGuard`), and a checkpoint holding
NaN or infinite tensors is refused wherever it is read (:func:`check_finite_checkpoint`).

The guard adds no host sync to training: the statistics it reads are those the run converts anyway, together, every
``log_every`` iterations (:meth:`~.log.Run.flush`), and the weights' finiteness is computed on their device and
converted in that same sync.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from rlstruct.algos._train.flags import field_help
from rlstruct.errors import CheckpointError

__all__ = ["WATCHED", "DivergenceGuard", "check_finite_checkpoint", "check_finite_settings", "non_finite"]

#: the prefixes of the training statistics that must stay finite: the losses and the gradient norms
WATCHED = ("loss", "grad_norm")


def check_finite_settings(config: Any) -> None:
    """Refuses a NaN or infinite value in any float setting of ``config`` (a run's config dataclass: the shared,
    the family's and the algorithm's fields alike).

    Raises:
        ValueError: a setting is NaN or infinite; the message names it, its value and its default.

    >>> from rlstruct.algos._train.config import RunConfig
    >>> check_finite_settings(RunConfig(lr=float("inf")))
    Traceback (most recent call last):
    ...
    ValueError: lr must be a finite number, got inf; pass a finite --lr (its default: 0.001)
    """
    helps = field_help(type(config))
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            hint = " or a large one, e.g. 1e9, for no practical limit" if "seconds" in helps[field.name][0] else ""
            raise ValueError(f"{field.name} must be a finite number, got {value!r}; pass a finite "
                             f"--{field.name.replace('_', '-')} (its default: {field.default!r}){hint}")


def _leaves(tree: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a tree of dicts, lists and tuples (a state dict, an optimizer's), each with its path."""
    if isinstance(tree, torch.Tensor):
        yield prefix, tree
    elif isinstance(tree, Mapping):
        for key, value in tree.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            yield from _leaves(value, f"{prefix}.{i}")


def non_finite(tree: Any, prefix: str = "") -> tuple[str, int, int] | None:
    """The first floating tensor of ``tree`` (a tensor, or dicts and lists of them) holding a NaN or an infinity:
    ``(its path, how many such values, its size)``; ``None`` when every value is finite.

    >>> non_finite({"w": torch.ones(3), "b": torch.tensor([0.0, float("nan")])}, "model")
    ('model.b', 1, 2)
    """
    for name, tensor in _leaves(tree, prefix):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name, int((~torch.isfinite(tensor)).sum()), tensor.numel()
    return None


def check_finite_checkpoint(checkpoint: Mapping[str, Any], shown: str, *, keys: tuple[str, ...] = ("model",)) -> None:
    """Refuses a checkpoint (``load_checkpoint``'s content) whose ``keys`` (the policy's weights; a resumed run's
    learner state too) hold a NaN or infinite value: a run that diverged wrote it.

    Args:
        checkpoint: the checkpoint's content.
        shown: how the messages name it, e.g. ``"resume='runs/a2c'"``.
        keys: the parts of the checkpoint to check.

    Raises:
        CheckpointError: a tensor holds NaN or infinite values; the message names the file and the tensor.
    """
    for key in keys:
        found = non_finite(checkpoint.get(key), key)
        if found is not None:
            name, bad, size = found
            raise CheckpointError(
                f"{shown} holds non-finite weights: {name} has {bad} NaN or infinite value(s) of {size} (the run that "
                "wrote it diverged); pass a checkpoint written before the divergence, or train again (e.g. with a "
                "lower --lr)"
            )


class DivergenceGuard:
    """Finds the first non-finite training statistic (:data:`WATCHED`: a loss, a gradient norm) or weight of a run.

    The run hands it the rows it converts every ``log_every`` iterations (one host sync for them all) with the
    finiteness of the watched weights, computed on their device by :meth:`weight_flags` and converted in the same
    sync. A divergence is thus found at most ``log_every`` iterations after it happened, at the iteration it happened
    for a statistic, at the check that found them for the weights (Adam keeps a NaN once it has one: weights that
    turned non-finite stay so until that check).

    Attributes:
        found: ``{"quantity": ..., "iteration": ..., "value": ...}`` of the first non-finite value found (``None``:
            none yet); ``quantity`` is a statistic's key (e.g. ``"loss/value"``) or ``"weights/NAME"``.
    """

    def __init__(self) -> None:
        self.weights: Callable[[], Mapping[str, torch.Tensor]] | None = None
        self.found: dict[str, Any] | None = None

    def watch(self, weights: Callable[[], Mapping[str, torch.Tensor]]) -> None:
        """Checks the tensors that ``weights()`` returns (e.g. a model's ``state_dict``) at every conversion."""
        self.weights = weights

    def weight_flags(self) -> dict[str, torch.Tensor]:
        """One 0-d bool tensor per floating tensor of the watched weights, on its device (no host sync); none once a
        divergence was found or without weights to watch."""
        if self.weights is None or self.found is not None:
            return {}
        return {f"weights/{name}": torch.isfinite(t.detach()).all() for name, t in self.weights().items()
                if t.is_floating_point()}

    def scan(self, rows: list[dict[str, Any]], flags: Mapping[str, float], iteration: int) -> None:
        """Records the first non-finite watched statistic of ``rows`` (converted), else the first weight whose
        ``flags`` value is false, as found at ``iteration``."""
        if self.found is not None:
            return
        for row in rows:
            for key, value in row.items():
                if key.startswith(WATCHED) and isinstance(value, float) and not math.isfinite(value):
                    self.found = {"quantity": key, "iteration": int(row["iteration"]), "value": str(value)}
                    return
        for key, ok in flags.items():
            if not ok:
                self.found = {"quantity": key, "iteration": iteration, "value": "nan or inf"}
                return
